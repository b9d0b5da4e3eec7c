"""A test fixture: a Docker token-auth server for a local registry (``docker-registry``).

It implements the registry token flow (the one Docker Hub uses) well enough for real
clients -- podman, the SDK's registry client, urllib:

1. the client asks the registry, gets ``401`` with
   ``WWW-Authenticate: Bearer realm="http://127.0.0.1:PORT/token",service="...",scope="..."``;
2. it sends ``GET realm?service=...&scope=repository:NAME:pull,push&account=USER`` here,
   with HTTP Basic credentials or none;
3. this server answers ``{"token": JWT, "access_token": JWT, "expires_in": 300, "issued_at": ...}``
   (or ``401`` for wrong credentials);
4. the client retries at the registry with ``Authorization: Bearer JWT``.

The JWT is RS256-signed with a 2048-bit RSA key whose self-signed certificate is the
registry's ``auth.token.rootcertbundle``.  The key and the certificate are made with the
``openssl`` command-line tool; the signature itself is computed here (PKCS#1 v1.5 with
SHA-256, Python integers), so no third-party crypto package is needed.

distribution 2.8 finds the signing key of a token from its JOSE header in one of three
ways, all implemented here (``header=``):

- ``"x5c"`` (default): the certificate chain, verified against the root bundle;
- ``"kid"``: the libtrust key ID of a key in the root bundle;
- ``"jwk"``: the public key itself (with its libtrust ``kid``), which must be in the bundle.

It is an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` (127.0.0.1 only, its own
event loop in a daemon thread), so it keeps answering while the caller blocks (e.g. in
``subprocess.run(["podman", "pull", ...])``).
It is a fixture for tests: credentials are plain strings in memory, tokens are not
revocable, and no TLS is spoken.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from aiohttp import web

from .httpserver import HttpServer, json_response

__all__ = ["TokenServer", "TokenRequest", "SigningKey", "libtrust_key_id", "make_signing_key"]


_HEADER_MODES = ("x5c", "kid", "jwk")


# --------------------------------------------------------------------------- #
# RSA / JOSE without third-party packages
# --------------------------------------------------------------------------- #


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _int_bytes(n: int) -> bytes:
    return n.to_bytes(max(1, (n.bit_length() + 7) // 8), "big")


def _der_read(data: bytes, pos: int) -> tuple[int, bytes, int]:
    """One DER TLV at ``pos``: (tag, value, position after it)."""
    tag = data[pos]
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        nbytes = length & 0x7F
        length = int.from_bytes(data[pos:pos + nbytes], "big")
        pos += nbytes
    return tag, data[pos:pos + length], pos + length


def _der_children(value: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos < len(value):
        tag, val, pos = _der_read(value, pos)
        out.append((tag, val))
    return out


def _pem_blocks(text: str) -> list[tuple[str, bytes]]:
    """All ``-----BEGIN X-----`` blocks of a PEM text: (label, DER)."""
    blocks: list[tuple[str, bytes]] = []
    label: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("-----BEGIN ") and line.endswith("-----"):
            label, body = line[11:-5], []
        elif line.startswith("-----END ") and label is not None:
            blocks.append((label, base64.b64decode("".join(body))))
            label = None
        elif label is not None:
            body.append(line)
    return blocks


def _rsa_private_numbers(der: bytes, label: str) -> tuple[int, int, int, int, int, int, int, int]:
    """(n, e, d, p, q, dp, dq, qinv) of a PKCS#1 or PKCS#8 RSA private key."""
    tag, seq, _ = _der_read(der, 0)
    items = _der_children(seq)
    if label == "PRIVATE KEY":  # PKCS#8: version, algorithm, OCTET STRING(RSAPrivateKey)
        inner = items[2][1]
        tag, seq, _ = _der_read(inner, 0)
        items = _der_children(seq)
    nums = [int.from_bytes(v, "big") for t, v in items[1:9]]
    if len(nums) != 8:
        raise ValueError("not an RSA private key")
    return tuple(nums)  # type: ignore[return-value]  # eight ints: the length is checked just above


def libtrust_key_id(spki_der: bytes) -> str:
    """The key ID distribution (via docker/libtrust) gives a public key.

    SHA-256 of the DER SubjectPublicKeyInfo, first 240 bits, base32 without padding, in
    twelve groups of four joined by ``:`` (``ABCD:EFGH:...``).
    """
    s = base64.b32encode(hashlib.sha256(spki_der).digest()[:30]).decode("ascii").rstrip("=")
    return ":".join(s[i:i + 4] for i in range(0, len(s), 4))


# DER DigestInfo prefix for SHA-256 (RFC 8017, section 9.2, note 1).
_SHA256_DIGEST_INFO = bytes.fromhex("3031300d060960864801650304020105000420")


@dataclass(frozen=True, repr=False)
class SigningKey:
    """An RSA key and its self-signed certificate (the registry's root cert bundle)."""

    key_path: Path
    cert_path: Path
    cert_der: bytes
    spki_der: bytes
    n: int
    e: int
    _d: int
    _p: int
    _q: int
    _dp: int
    _dq: int
    _qinv: int

    def __repr__(self) -> str:
        return f"SigningKey(cert={str(self.cert_path)!r}, kid={self.kid!r})"

    @classmethod
    def load(cls, key_path: Path, cert_path: Path) -> "SigningKey":
        key_blocks = _pem_blocks(key_path.read_text())
        if not key_blocks:
            raise ValueError(f"{key_path}: no PEM private key")
        label, der = key_blocks[0]
        n, e, d, p, q, dp, dq, qinv = _rsa_private_numbers(der, label)
        certs = [der for label, der in _pem_blocks(cert_path.read_text()) if label == "CERTIFICATE"]
        if not certs:
            raise ValueError(f"{cert_path}: no PEM certificate")
        # SubjectPublicKeyInfo = SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING(RSAPublicKey) }
        rsa_pub = b"\x30" + _der_len(len(_der_int(n) + _der_int(e))) + _der_int(n) + _der_int(e)
        alg = bytes.fromhex("300d06092a864886f70d0101010500")
        bits = b"\x03" + _der_len(len(rsa_pub) + 1) + b"\x00" + rsa_pub
        spki = b"\x30" + _der_len(len(alg) + len(bits)) + alg + bits
        return cls(key_path, cert_path, certs[0], spki, n, e, d, p, q, dp, dq, qinv)

    @property
    def kid(self) -> str:
        return libtrust_key_id(self.spki_der)

    def jwk(self) -> dict[str, str]:
        return {"kty": "RSA", "kid": self.kid, "n": _b64url(_int_bytes(self.n)), "e": _b64url(_int_bytes(self.e))}

    def sign_rs256(self, message: bytes) -> bytes:
        k = (self.n.bit_length() + 7) // 8
        t = _SHA256_DIGEST_INFO + hashlib.sha256(message).digest()
        em = b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t
        m = int.from_bytes(em, "big")
        # CRT: two half-size exponentiations instead of one.
        m1 = pow(m, self._dp, self._p)
        m2 = pow(m, self._dq, self._q)
        h = (self._qinv * (m1 - m2)) % self._p
        s = m2 + h * self._q
        return s.to_bytes(k, "big")

    def verify_rs256(self, message: bytes, signature: bytes) -> bool:
        k = (self.n.bit_length() + 7) // 8
        em = pow(int.from_bytes(signature, "big"), self.e, self.n).to_bytes(k, "big")
        t = _SHA256_DIGEST_INFO + hashlib.sha256(message).digest()
        return em == b"\x00\x01" + b"\xff" * (k - len(t) - 3) + b"\x00" + t


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    b = _int_bytes(n)
    return bytes([0x80 | len(b)]) + b


def _der_int(n: int) -> bytes:
    b = _int_bytes(n)
    if b[0] & 0x80:
        b = b"\x00" + b
    return b"\x02" + _der_len(len(b)) + b


def make_signing_key(directory: Path, *, common_name: str = "flowmesh-test-token-issuer",
                     days: int = 7) -> SigningKey:
    """Make (or reuse) ``key.pem``/``cert.pem`` in ``directory`` with the ``openssl`` CLI."""
    directory = Path(directory)
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    if not (key_path.is_file() and cert_path.is_file()):
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("the token server needs the openssl command: apt-get install -y openssl")
        directory.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
             "-keyout", str(key_path), "-out", str(cert_path), "-days", str(days),
             "-subj", f"/CN={common_name}"],
            capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"openssl req failed: {proc.stderr.strip()[-500:]}")
        os.chmod(key_path, 0o600)
    return SigningKey.load(key_path, cert_path)


# --------------------------------------------------------------------------- #
# The server
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class TokenRequest:
    """One request the token server answered."""

    account: str | None          # the authenticated user, None for anonymous
    service: str | None
    scopes: tuple[str, ...]      # as asked
    granted: tuple[dict[str, Any], ...] = field(default=())  # the token's "access" claim
    status: int = 200


def _parse_scope(scope: str) -> dict[str, Any] | None:
    """``repository:flowmesh/busybox:pull,push`` -> {"type", "name", "actions"}.

    The name may itself contain colons (``repository:127.0.0.1:5000/x:pull`` is not valid,
    but ``registry:catalog:*`` is), so type is before the first colon, actions after the last.
    """
    first, last = scope.find(":"), scope.rfind(":")
    if first <= 0 or last == first:
        return None
    actions = [a for a in scope[last + 1:].split(",") if a]
    return {"type": scope[:first], "name": scope[first + 1:last], "actions": actions}


class TokenServer(HttpServer):
    """A test fixture: Docker token-auth server on 127.0.0.1 (see the module docstring).

    ``users`` maps user names to passwords.  A client with valid credentials gets every
    action it asks for; one without credentials gets ``pull`` on repositories when
    ``anonymous_pull`` is true and an empty grant otherwise (the registry then answers
    ``401``); wrong credentials get ``401`` from here.
    """

    def __init__(self, *, service: str = "flowmesh-registry",
                 issuer: str = "flowmesh-test-token-server",
                 users: dict[str, str] | None = None,
                 anonymous_pull: bool = False,
                 header: str = "x5c",
                 expires_in: int = 300,
                 key_dir: str | os.PathLike[str] | None = None) -> None:
        if header not in _HEADER_MODES:
            raise ValueError(f"header must be one of {_HEADER_MODES}, not {header!r}")
        self.service = service
        self.issuer = issuer
        self._users = dict(users or {})
        self.anonymous_pull = anonymous_pull
        self.header = header
        self.expires_in = expires_in
        self._key_dir_arg = Path(key_dir) if key_dir is not None else None
        self._tmpdir: Path | None = None
        self.key: SigningKey | None = None
        super().__init__()
        self._lock = threading.Lock()
        self._requests: list[TokenRequest] = []

    def __repr__(self) -> str:
        state = f"realm={self.realm!r}" if self.running else "stopped"
        return f"TokenServer({state}, service={self.service!r}, users={sorted(self._users)!r})"

    # ---- lifecycle -------------------------------------------------------- #

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    @property
    def cert_path(self) -> Path:
        """The certificate to give the registry as ``auth.token.rootcertbundle``."""
        if self.key is None:
            raise RuntimeError("the token server is not running")
        return self.key.cert_path

    def start(self) -> "TokenServer":
        if self.running:
            return self
        if self._key_dir_arg is not None:
            key_dir = self._key_dir_arg
        else:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="flowmesh-tokenserver-"))
            key_dir = self._tmpdir
        try:
            self.key = make_signing_key(key_dir)
            super().start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        super().stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # ---- users and records ------------------------------------------------ #

    def add_user(self, username: str, password: str) -> None:
        with self._lock:
            self._users[username] = password

    @property
    def requests(self) -> list[TokenRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    # ---- tokens ----------------------------------------------------------- #

    def issue(self, account: str | None, access: list[dict[str, Any]]) -> str:
        """A signed JWT for ``account`` (``None``: anonymous) granting ``access``."""
        if self.key is None:
            raise RuntimeError("the token server is not running")
        now = int(time.time())
        header: dict[str, Any] = {"typ": "JWT", "alg": "RS256"}
        if self.header == "x5c":
            header["x5c"] = [base64.b64encode(self.key.cert_der).decode("ascii")]
        elif self.header == "kid":
            header["kid"] = self.key.kid
        else:
            header["jwk"] = self.key.jwk()
        claims = {
            "iss": self.issuer,
            "sub": account or "",
            "aud": self.service,         # a string: distribution 2.8 does not take a list
            "exp": now + self.expires_in,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing_input = (_b64url(json.dumps(header, separators=(",", ":")).encode())
                         + "." + _b64url(json.dumps(claims, separators=(",", ":")).encode()))
        signature = self.key.sign_rs256(signing_input.encode("ascii"))
        return signing_input + "." + _b64url(signature)

    def _check_credentials(self, authorization: str | None) -> tuple[bool, str | None]:
        """(ok, account): ok is False for wrong or malformed credentials."""
        if not authorization:
            return True, None
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False, None
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False, None
        if not sep:
            return False, None
        with self._lock:
            expected = self._users.get(user)
        if expected is None or not secrets.compare_digest(expected.encode(), password.encode()):
            return False, None
        return True, user

    def _grant(self, account: str | None, scopes: list[str]) -> list[dict[str, Any]]:
        granted = []
        for scope in scopes:
            parsed = _parse_scope(scope)
            if parsed is None:
                continue
            if account is None:
                if not (self.anonymous_pull and parsed["type"] == "repository"):
                    continue
                parsed["actions"] = [a for a in parsed["actions"] if a == "pull"]
                if not parsed["actions"]:
                    continue
            granted.append(parsed)
        return granted

    # ---- HTTP ------------------------------------------------------------- #

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/token":
            return json_response(404, {"errors": [{"code": "NOT_FOUND"}]})
        if request.method != "GET":
            return json_response(405, {"errors": [{"code": "UNSUPPORTED"}]})
        query = parse_qs(urlsplit(request.raw_path).query)
        scopes = [s for value in query.get("scope", []) for s in value.split(" ") if s]
        service = query["service"][0] if query.get("service") else None
        ok, account = self._check_credentials(request.headers.get("authorization"))
        if not ok:
            with self._lock:
                self._requests.append(TokenRequest(None, service, tuple(scopes), (), 401))
            return json_response(401, {"errors": [{"code": "UNAUTHORIZED", "message": "invalid credentials"}]},
                                 {"WWW-Authenticate": 'Basic realm="flowmesh-token"'})
        access = self._grant(account, scopes)
        token = self.issue(account, access)
        with self._lock:
            self._requests.append(TokenRequest(account, service, tuple(scopes), tuple(access), 200))
        issued = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return json_response(200, {"token": token, "access_token": token,
                                   "expires_in": self.expires_in, "issued_at": issued})
