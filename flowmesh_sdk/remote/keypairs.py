"""SSH key material, in memory: :class:`PublicKey`, :class:`KeyPair`, :func:`fingerprint`,
:func:`generate_ed25519` and :func:`secret_fragments`.

The ``cryptography`` package (which paramiko depends on) does the key work, imported when
first needed.  Nothing here touches a file: the fleet key's files and the trust record are
:mod:`.keys`, which re-exports these names (defined there first).  Private keys never
appear in reprs or exception messages.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from ..errors import SpecError

if TYPE_CHECKING:   # cryptography comes with paramiko (the ssh extra): imported lazily by _crypto
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["KeyPair", "PublicKey", "fingerprint", "generate_ed25519", "secret_fragments"]


def _crypto() -> tuple[ModuleType, ModuleType]:
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - paramiko (the ssh extra) brings it
        raise ImportError("SSH keys need the 'cryptography' package: "
                          "pip install 'flowmesh-sdk[ssh]'") from exc
    return serialization, ed25519


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob: ``SHA256:`` + unpadded base64."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True, slots=True)
class PublicKey:
    """An SSH public key: its type (``ssh-ed25519``), its wire-format blob and an
    optional comment (not part of equality)."""

    key_type: str
    blob: bytes = field(repr=False)
    comment: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # The SSH wire format starts with the key type as a length-prefixed string
        # (RFC 4253 section 6.6); a blob whose embedded type disagrees is not this key.
        if len(self.blob) < 4:
            raise SpecError("ssh.public_key", "the key blob is too short")
        (n,) = struct.unpack(">I", self.blob[:4])
        if self.blob[4:4 + n] != self.key_type.encode():
            raise SpecError("ssh.public_key", f"the blob is not a {self.key_type!r} key")

    @classmethod
    def parse(cls, line: str, *, field_name: str = "ssh.public_key") -> PublicKey:
        """``'ssh-ed25519 AAAA... [comment]'`` -> PublicKey; SpecError naming ``field_name``."""
        parts = line.split(None, 2) if isinstance(line, str) else []
        if len(parts) < 2:
            raise SpecError(field_name, "must be a public key line '<type> <base64> [comment]', "
                                        "e.g. 'ssh-ed25519 AAAA...'")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except ValueError as exc:
            raise SpecError(field_name, "the key's second word is not base64") from exc
        try:
            return cls(parts[0], blob, parts[2].strip() if len(parts) > 2 else "")
        except SpecError as exc:
            raise SpecError(field_name, str(exc).split(": ", 1)[-1]) from exc

    @property
    def line(self) -> str:
        """``type base64`` (no comment): what a trust record or ``SshTarget.host_key`` holds."""
        return f"{self.key_type} {base64.b64encode(self.blob).decode()}"

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)

    def __str__(self) -> str:
        return f"{self.key_type} {self.fingerprint}"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An ed25519 key pair.  The private half is held as OpenSSH-format text and shown
    nowhere: not in the repr, not in ``str``, not in any message."""

    public: PublicKey
    _private: bytes = field(repr=False, compare=False)

    def __repr__(self) -> str:
        return f"KeyPair({self.public}, private=<hidden>)"

    __str__ = __repr__

    def private_openssh(self) -> str:
        """The private key in OpenSSH format (``-----BEGIN OPENSSH PRIVATE KEY-----``).
        Handle with care: this is the secret."""
        return self._private.decode()

    @classmethod
    def from_private_openssh(cls, text: str | bytes, *, comment: str = "") -> KeyPair:
        serialization, ed25519 = _crypto()
        data = text.encode() if isinstance(text, str) else bytes(text)
        try:
            key = serialization.load_ssh_private_key(data, password=None)
        except Exception as exc:  # noqa: BLE001 - ValueError, TypeError, UnsupportedAlgorithm, ...
            # Not chained, on purpose: cryptography's messages can quote bytes of the key
            # being parsed (UnsupportedAlgorithm: "Unsupported key type: b'...'"), and a
            # chained cause ends up in every logged traceback.  Only the class is kept.
            raise SpecError("ssh.private_key", "not an unencrypted OpenSSH private key "
                                               f"({type(exc).__name__})") from None
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise SpecError("ssh.private_key", f"must be an ed25519 key, got {type(key).__name__}")
        return _pair(key, comment)


def _pair(key: Ed25519PrivateKey, comment: str) -> KeyPair:
    serialization, _ = _crypto()
    pub_line = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                             serialization.PublicFormat.OpenSSH).decode()
    pub = PublicKey.parse(pub_line)
    pub = PublicKey(pub.key_type, pub.blob, comment)
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    return KeyPair(pub, priv)


def secret_fragments(private_openssh: str, *, min_len: int = 16) -> list[str]:
    """Pieces of an OpenSSH private key's text that encode nothing but the secret ed25519
    seed: any text containing one of them contains the private key.  (The key file's first
    lines hold only public data -- the format header and the public key -- so searching
    for "any line of the key" would flag public keys too.)  For tests and log scanners."""
    serialization, ed25519 = _crypto()
    lines = [ln.strip() for ln in private_openssh.strip().splitlines()
             if ln.strip() and not ln.startswith("-----")]
    body = "".join(lines)
    key = serialization.load_ssh_private_key(private_openssh.encode(), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SpecError("ssh.private_key", "must be an ed25519 key")
    seed = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())
    off = base64.b64decode(body).find(seed)
    start, end = -(-off // 3) * 4, ((off + len(seed)) // 3) * 4   # base64 chars of seed bytes only
    out, pos = [], 0
    for line in lines:
        a, b = max(start, pos), min(end, pos + len(line))
        if b - a >= min_len:
            out.append(body[a:b])
        pos += len(line)
    return out


def generate_ed25519(comment: str = "") -> KeyPair:
    """A fresh ed25519 key pair (in memory; nothing is written)."""
    _, ed25519 = _crypto()
    return _pair(ed25519.Ed25519PrivateKey.generate(), comment)
