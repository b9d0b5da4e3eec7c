"""The user's own OpenSSH ``known_hosts`` files, read as OpenSSH reads them (never written).

paramiko's :class:`paramiko.HostKeys` (5.1) matches plain and hashed (``|1|salt|hash``)
host names, but it knows no markers: an ``@cert-authority`` or ``@revoked`` line is
skipped or breaks the load, host patterns (``*.lab``, ``!bad.lab``) never match, and a
host *certificate* is never checked against a CA.  This module adds exactly that, and
reuses the libraries for the rest: paramiko's ``HostKeys.hash_host`` for hashed names,
``cryptography``'s SSH certificate parser for the certificate's signature.

A server's key is judged as OpenSSH's ``ssh`` does (``sshconnect.c``, ``check_host_key``;
``PROTOCOL.certkeys``):

* a key (or a certificate's key, or its CA) listed ``@revoked`` for the host: refused;
* a host certificate whose CA is an ``@cert-authority`` key for the host: accepted when
  the CA's signature verifies, it is a *host* certificate, the host is one of its
  principals (an empty list means any host, as in OpenSSH), now is inside its validity
  window and it carries no critical options; otherwise refused.  A certificate from a CA
  not listed for the host is judged by its plain key, as OpenSSH does;
* a plain key listed for the host: accepted; the host listed with other keys only:
  refused ("host key changed"); the host not listed at all: ``UNKNOWN`` (the caller
  decides: refuse, or trust on first use when asked for).

Malformed lines are skipped, as OpenSSH skips them.
"""

from __future__ import annotations

import base64
import hmac
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AuthError, SpecError
from .keys import PublicKey

if TYPE_CHECKING:   # cryptography comes with paramiko (the ssh extra); imported where used
    from cryptography.hazmat.primitives.serialization import SSHCertPublicKeyTypes

log = logging.getLogger("flowmesh.remote.known_hosts")

CERT_SUFFIX = "-cert-v01@openssh.com"
#: what OpenSSH reads when the ssh config names no UserKnownHostsFile / GlobalKnownHostsFile
DEFAULT_FILES = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2", "/etc/ssh/ssh_known_hosts",
                 "/etc/ssh/ssh_known_hosts2")

KNOWN = "known"
UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class KnownHostLine:
    """One line: its marker (``""``, ``@cert-authority`` or ``@revoked``), its host
    patterns, its key, and where it is (``file:line``, for messages)."""

    marker: str
    patterns: tuple[str, ...]
    key: PublicKey
    where: str


def _glob(pattern: str) -> re.Pattern[str]:
    """An OpenSSH host pattern (``*`` and ``?`` wildcards, nothing else special)."""
    out = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(out + r"\Z", re.I)


def _hashed_match(name: str, entry: str) -> bool:
    from paramiko.hostkeys import HostKeys   # the [ssh] extra
    try:
        return hmac.compare_digest(HostKeys.hash_host(name, entry), entry)
    except Exception:  # noqa: BLE001 - a malformed |1| entry matches nothing
        return False


def host_matches(patterns: Iterable[str], names: Sequence[str]) -> bool:
    """OpenSSH's ``match_hostname`` over a line's comma-separated patterns: some
    positive pattern matches one of ``names`` and no negated one (``!pat``) does."""
    hit = False
    for pat in patterns:
        if pat.startswith("|1|"):
            hit = hit or any(_hashed_match(n, pat) for n in names)
            continue
        neg = pat.startswith("!")
        rx = _glob(pat[1:] if neg else pat)
        if any(rx.match(n) for n in names):
            if neg:
                return False
            hit = True
    return hit


def parse_lines(text: str, source: str) -> list[KnownHostLine]:
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        parts = raw.split()
        if not parts or parts[0].startswith("#"):
            continue
        marker = parts.pop(0) if parts[0] in ("@cert-authority", "@revoked") else ""
        if len(parts) < 3:
            log.debug("%s:%d: not a known_hosts line; skipped", source, n)
            continue
        try:
            key = PublicKey.parse(f"{parts[1]} {parts[2]}")
        except SpecError:
            log.debug("%s:%d: unreadable key; skipped", source, n)
            continue
        out.append(KnownHostLine(marker, tuple(parts[0].split(",")), key, f"{source}:{n}"))
    return out


class UserKnownHosts:
    """OpenSSH known_hosts files (missing ones are skipped), re-read at each check: a
    line the user adds or removes counts from the next connection on.  Blocking (small
    file reads): the SSH runner calls it from its connect thread."""

    def __init__(self, paths: Sequence[str | Path] = DEFAULT_FILES) -> None:
        self.paths = tuple(Path(p).expanduser() for p in paths)

    def __repr__(self) -> str:
        return f"UserKnownHosts({', '.join(map(str, self.paths))})"

    def lines(self) -> list[KnownHostLine]:
        out: list[KnownHostLine] = []
        for p in self.paths:
            try:
                text = p.read_text(errors="replace")
            except OSError:
                continue
            out += parse_lines(text, str(p))
        return out

    def for_host(self, names: Sequence[str]) -> list[KnownHostLine]:
        return [ln for ln in self.lines() if host_matches(ln.patterns, names)]

    def preferred_types(self, names: Sequence[str]) -> list[str]:
        """Host key algorithms to ask for first, as OpenSSH orders them: certificates
        when a CA is listed for the host, then the types of its listed keys."""
        lines = self.for_host(names)
        out: list[str] = []
        for ln in lines:
            if ln.marker == "@cert-authority":
                out += [t + CERT_SUFFIX for t in _algorithms(None)]
        for ln in lines:
            if not ln.marker:
                out += _algorithms(ln.key.key_type)
        return list(dict.fromkeys(out))

    def verify(self, names: Sequence[str], key_type: str, blob: bytes, cert: bytes | None,
               label: str, principal: str) -> str:
        """Judge a server's key (``blob``: its plain key; ``cert``: the certificate it
        presented, if any) for a host known as ``names`` (``principal``: the bare name a
        certificate must list): :data:`KNOWN`, :data:`UNKNOWN`, or AuthError (revoked, bad
        certificate, changed key)."""
        lines = self.for_host(names)
        plain = PublicKey(key_type, blob)
        revoked = {ln.key: ln.where for ln in lines if ln.marker == "@revoked"}
        if plain in revoked:
            raise AuthError(f"{label}: the host key {plain} is marked @revoked ({revoked[plain]}); "
                            "refusing to connect", provider="ssh")
        if cert is not None:
            ca, checked = _check_cert(cert, principal, plain, label)
            if ca in revoked:
                raise AuthError(f"{label}: the host certificate's CA {ca} is marked @revoked "
                                f"({revoked[ca]}); refusing to connect", provider="ssh")
            cas = [ln for ln in lines if ln.marker == "@cert-authority" and ln.key == ca]
            if cas:
                checked()   # raises AuthError when the certificate is not valid for this host
                log.debug("%s: host certificate signed by %s (%s)", label, ca, cas[0].where)
                return KNOWN
            # no CA listed for this host signed it: judged by its plain key, as OpenSSH does
        listed = [ln for ln in lines if not ln.marker]
        if any(ln.key == plain for ln in listed):
            return KNOWN
        if listed:
            where = ", ".join(f"{ln.key} ({ln.where})" for ln in listed[:3])
            raise AuthError(f"{label}: host key changed: it presented {plain}, but known_hosts lists "
                            f"{where}; refusing to connect. If the machine was really reinstalled, "
                            "check its new fingerprint on it and update known_hosts "
                            f"(ssh-keygen -R {names[0]})", provider="ssh")
        return UNKNOWN


def _algorithms(key_type: str | None) -> list[str]:
    """Host key algorithm names for a key type (None: every type paramiko verifies)."""
    every = {"ssh-ed25519": ["ssh-ed25519"], "ssh-rsa": ["rsa-sha2-512", "rsa-sha2-256"],
             "ecdsa-sha2-nistp256": ["ecdsa-sha2-nistp256"], "ecdsa-sha2-nistp384": ["ecdsa-sha2-nistp384"],
             "ecdsa-sha2-nistp521": ["ecdsa-sha2-nistp521"]}
    if key_type is None:
        return [a for algs in every.values() for a in algs]
    return every.get(key_type, [key_type])


def _check_cert(cert_blob: bytes, host: str, plain: PublicKey,
                label: str) -> tuple[PublicKey, Callable[[], None]]:
    """The certificate's CA key, and a check (call it only once the CA is trusted for the
    host) of its signature, kind, principals, validity and critical options."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    n = int.from_bytes(cert_blob[:4], "big")
    cert_type = cert_blob[4:4 + n].decode("ascii", "replace")
    try:
        cert = serialization.load_ssh_public_identity(
            cert_type.encode() + b" " + base64.b64encode(cert_blob))
    except (ValueError, TypeError) as exc:
        raise AuthError(f"{label}: the server's host certificate does not parse "
                        f"({type(exc).__name__}: {exc})", provider="ssh") from exc
    if not isinstance(cert, serialization.SSHCertificate):
        raise AuthError(f"{label}: the server's host key is not a certificate", provider="ssh")

    def openssh(k: SSHCertPublicKeyTypes) -> PublicKey:
        return PublicKey.parse(k.public_bytes(serialization.Encoding.OpenSSH,
                                              serialization.PublicFormat.OpenSSH).decode())

    ca = openssh(cert.signature_key())

    def checked() -> None:
        bad = None
        try:
            cert.verify_cert_signature()
        except InvalidSignature:
            bad = "its CA signature does not verify"
        if bad is None and openssh(cert.public_key()) != plain:
            bad = "it certifies another key than the one that signed the key exchange"
        elif bad is None and cert.type is not serialization.SSHCertificateType.HOST:
            bad = "it is a user certificate, not a host certificate"
        elif bad is None and cert.valid_principals and host.encode() not in cert.valid_principals:
            shown = ", ".join(p.decode("utf-8", "replace") for p in cert.valid_principals[:5])
            bad = f"{host!r} is not one of its principals ({shown})"
        elif bad is None and not cert.valid_after <= time.time() < cert.valid_before:
            bad = (f"it is valid from {_when(cert.valid_after)} to {_when(cert.valid_before)} only")
        elif bad is None and cert.critical_options:
            bad = f"it carries critical options ({', '.join(o.decode() for o in cert.critical_options)})"
        if bad:
            raise AuthError(f"{label}: host certificate (key id {cert.key_id.decode('utf-8', 'replace')!r}, "
                            f"CA {ca}) refused: {bad}", provider="ssh")
    return ca, checked


def _when(t: int) -> str:
    if t >= 2**63:
        return "forever"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
