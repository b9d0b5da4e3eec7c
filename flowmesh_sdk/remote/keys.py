"""SSH keys and trust: the fleet's client key, per-launch host keys, and the trust record.

Three things live here, all in-process (the ``cryptography`` package paramiko already
depends on does the key work; no ``ssh-keygen`` subprocess):

* **The fleet's client key** (:class:`FleetKey`): one ed25519 key pair, generated the
  first time it is needed and kept in ``$FLOWMESH_HOME/keys/fleet_ed25519`` (OpenSSH
  format) with its public half next to it (``.pub``).  Its public key is what launches
  inject into ``authorized_keys``; the private key never leaves this machine.
* **Host key pairs** (:func:`generate_ed25519`, :class:`KeyPair`): one per launch request;
  the private half goes into the instance's user-data (see :mod:`.cloudinit`), the public
  half is pinned.  The SDK keeps no copy of the private half after the launch call.
* **The trust record** (:class:`KnownHosts`): ``$FLOWMESH_HOME/keys/known_hosts``, in
  OpenSSH's ``known_hosts`` line format (``HOST KEYTYPE BASE64 COMMENT``).  It holds the
  keys injected at launch (pinned from the start) and the keys learnt by trust on first
  use, for the user's machines marked so (:mod:`.trust`; the user's own known_hosts is
  read by :mod:`.known_hosts`, never written): the first connection records the
  key with a WARNING naming the host and the fingerprint; later connections must present
  exactly that key; a different one is refused with :class:`AuthError` naming the host
  and both fingerprints.  Nothing is ever replaced silently: to accept a new key, remove
  the line (:meth:`KnownHosts.forget`, or edit the file).

Permissions: the keys directory is 0700 and every file in it 0600, owned by the current
user.  A directory or file that is only *readable* by others is tightened in place, with
a WARNING.  Anything *writable* by others, owned by someone else, or a private key that
others could read is refused with :class:`AuthError` (as OpenSSH refuses an unprotected
private key): it may already have been read or replaced, and the fix is the user's call.

Private keys never appear in logs, reprs or exception messages: reprs show the key type
and the SHA256 fingerprint (OpenSSH's ``ssh-keygen -l`` form) only.

The key material itself (:class:`PublicKey`, :class:`KeyPair`, :func:`generate_ed25519`,
:func:`fingerprint`, :func:`secret_fragments`) is :mod:`.keypairs`, importable from here too.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import home_dir
from ..errors import AuthError, SpecError
# the in-memory key material lives in .keypairs; its names are importable from here too
from .keypairs import KeyPair, PublicKey, fingerprint, generate_ed25519, secret_fragments

log = logging.getLogger("flowmesh.remote.keys")

FLEET_KEY_NAME = "fleet_ed25519"
KNOWN_HOSTS_NAME = "known_hosts"
DIR_MODE = 0o700
FILE_MODE = 0o600


# --------------------------------------------------------------------------- #
# the keys directory and its permissions
# --------------------------------------------------------------------------- #


def keys_dir(home: str | Path | None = None) -> Path:
    """Where keys and the trust record live: ``<home>/keys`` (home: ``FLOWMESH_HOME``)."""
    return Path(home) / "keys" if home is not None else home_dir() / "keys"


def ensure_private_dir(path: str | Path) -> Path:
    """Create ``path`` as 0700 (or check it): tightened when only readable by others,
    refused when writable by others or owned by another user."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = p.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise AuthError(f"{p} must be a directory")
    _check_mode(p, st, is_dir=True, secret=False)
    return p


def _check_mode(path: Path, st: os.stat_result, *, is_dir: bool, secret: bool) -> None:
    if st.st_uid != os.getuid():
        raise AuthError(f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}); "
                        "refusing to use keys or trust records someone else controls")
    mode = stat.S_IMODE(st.st_mode)
    want = DIR_MODE if is_dir else FILE_MODE
    if mode & 0o022:
        raise AuthError(f"{path} is writable by other users (mode {mode:04o}): its keys or trust "
                        f"records may have been replaced. Check it, then run chmod {want:o} {path}")
    if secret and mode & 0o077:
        raise AuthError(f"{path} is readable by other users (mode {mode:04o}): this private key may "
                        f"have leaked. Run chmod 600 {path} if you trust it, or delete it so a new "
                        "one is made (instances that trust the old key must then be relaunched)")
    if mode != want:
        if mode & 0o077:
            log.warning("%s was readable by other users (mode %04o); tightened to %04o", path, mode, want)
        os.chmod(path, want)


def check_file(path: str | Path, *, secret: bool) -> None:
    """Check (and tighten) one file under the keys directory; see the module docstring."""
    p = Path(path)
    st = p.stat()
    if not stat.S_ISREG(st.st_mode):
        raise AuthError(f"{p} must be a regular file")
    _check_mode(p, st, is_dir=False, secret=secret)


def _write_new(path: Path, data: bytes) -> Path:
    """Write ``data`` to a fresh 0600 file next to ``path`` (never through an existing one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # whatever the umask
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


# --------------------------------------------------------------------------- #
# the fleet's client key
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, slots=True)
class FleetKey:
    """The fleet's client key on disk: the private key's path (never its contents) and
    the public key that launches inject."""

    private_path: str
    public: PublicKey

    def __repr__(self) -> str:
        return f"FleetKey({self.public}, private_path={self.private_path})"

    @classmethod
    def load_or_create(cls, directory: str | Path | None = None) -> FleetKey:
        """The key in ``directory`` (default :func:`keys_dir`), generated on first use.

        Blocking (file I/O); call it in a thread from async code.  Two processes creating
        it at once agree on one key: each writes a private temp file and hard-links it
        into place; the loser reads the winner's."""
        d = ensure_private_dir(directory if directory is not None else keys_dir())
        path = d / FLEET_KEY_NAME
        if not path.exists():
            pair = generate_ed25519("flowmesh-fleet")
            tmp = _write_new(path, pair.private_openssh().encode())
            try:
                os.link(tmp, path)
                log.info("generated the fleet's client key %s (%s)", path, pair.public)
            except FileExistsError:
                pass   # another process made it first: use theirs
            finally:
                tmp.unlink(missing_ok=True)
        check_file(path, secret=True)
        try:
            pair = KeyPair.from_private_openssh(path.read_bytes(), comment="flowmesh-fleet")
        except SpecError as exc:
            raise AuthError(f"{path} is not a usable fleet key: {exc}") from exc
        pub_path = d / (FLEET_KEY_NAME + ".pub")
        text = f"{pair.public.line} flowmesh-fleet\n"
        if not pub_path.exists() or pub_path.read_text() != text:
            os.replace(_write_new(pub_path, text.encode()), pub_path)
        check_file(pub_path, secret=False)
        return cls(str(path), pair.public)


# --------------------------------------------------------------------------- #
# the trust record
# --------------------------------------------------------------------------- #


def host_id(host: str, port: int = 22) -> str:
    """How a machine is named in the trust record: OpenSSH's ``host`` or ``[host]:port``."""
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True, slots=True)
class TrustEntry:
    """One line of the trust record: the host id, its key, and how it came to be trusted
    (``injected``: the SDK generated it and handed it to the machine at launch; ``tofu``:
    learnt on first use)."""

    host: str
    key: PublicKey
    how: str
    since: str


class KnownHosts:
    """The trust record (``known_hosts``): a locked, atomically rewritten file of
    :class:`TrustEntry` lines.  Every method is blocking (small file I/O under ``flock``);
    the SSH runner calls :meth:`check` from its connect thread (through
    :class:`~flowmesh_sdk.remote.trust.HostTrust`)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else keys_dir() / KNOWN_HOSTS_NAME

    def __repr__(self) -> str:
        return f"KnownHosts({self.path})"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_private_dir(self.path.parent)
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)   # releases the lock

    def _read(self) -> dict[str, TrustEntry]:
        if not self.path.exists():
            return {}
        check_file(self.path, secret=False)
        out: dict[str, TrustEntry] = {}
        for n, raw in enumerate(self.path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            try:
                key = PublicKey.parse(" ".join(parts[1:3]))
            except (SpecError, IndexError) as exc:
                raise AuthError(f"{self.path} line {n} is not 'HOST KEYTYPE BASE64 [COMMENT]'; "
                                "fix or remove it (the trust record is not used while it is broken)") from exc
            how, since = "tofu", ""
            if len(parts) > 3 and parts[3].startswith("flowmesh:"):
                bits = parts[3].split(":", 2)
                how = bits[1] if len(bits) > 1 else how
                since = bits[2] if len(bits) > 2 else ""
            out[parts[0]] = TrustEntry(parts[0], key, how, since)
        return out

    def _write(self, entries: dict[str, TrustEntry]) -> None:
        lines = ["# FlowMesh SDK trust record (OpenSSH known_hosts format). One key per host;",
                 "# 'injected' keys were generated by the SDK and handed to the machine at launch,",
                 "# 'tofu' keys were learnt on first use. Remove a line to accept a new key."]
        for e in entries.values():
            lines.append(f"{e.host} {e.key.line} flowmesh:{e.how}:{e.since}")
        tmp = _write_new(self.path, ("\n".join(lines) + "\n").encode())
        os.replace(tmp, self.path)

    # ---- reading -------------------------------------------------------------------
    def get(self, host: str) -> PublicKey | None:
        with self._locked():
            entry = self._read().get(host)
        return entry.key if entry else None

    def entries(self) -> list[TrustEntry]:
        with self._locked():
            return list(self._read().values())

    # ---- changing --------------------------------------------------------------------
    def pin(self, host: str, key: PublicKey, *, how: str = "injected") -> None:
        """Record ``key`` for ``host`` (a key the SDK generated and injected).  The same
        key again is a no-op; a different one already there is refused (AuthError)."""
        with self._locked():
            entries = self._read()
            old = entries.get(host)
            if old is not None:
                if old.key == key:
                    return
                raise AuthError(f"{host} already has a different trusted key ({old.key}) in "
                                f"{self.path}; not replacing it with {key}")
            entries[host] = TrustEntry(host, key, how, _now())
            self._write(entries)

    def pin_many(self, items: Iterable[tuple[str, PublicKey]], *, how: str = "injected") -> None:
        items = list(items)
        with self._locked():
            entries = self._read()
            for host, key in items:
                old = entries.get(host)
                if old is not None and old.key != key:
                    raise AuthError(f"{host} already has a different trusted key ({old.key}) in "
                                    f"{self.path}; not replacing it with {key}")
            changed = False
            for host, key in items:
                if host not in entries:
                    entries[host] = TrustEntry(host, key, how, _now())
                    changed = True
            if changed:
                self._write(entries)

    def forget(self, hosts: Iterable[str]) -> None:
        """Drop the records of ``hosts`` (terminated instances; or a host whose new key
        the user has checked and wants to accept on the next connection)."""
        hosts = set(hosts)
        with self._locked():
            entries = self._read()
            if hosts & entries.keys():
                self._write({k: v for k, v in entries.items() if k not in hosts})

    def check(self, host: str, key: PublicKey, *, name: str = "") -> None:
        """Trust on first use: an unknown ``host`` has ``key`` recorded (WARNING naming the
        host and the fingerprint); a known one must present exactly the recorded key, or
        AuthError names the host and both fingerprints."""
        label = f"{name} ({host})" if name and name != host else host
        with self._locked():
            entries = self._read()
            old = entries.get(host)
            if old is None:
                entries[host] = TrustEntry(host, key, "tofu", _now())
                self._write(entries)
                log.warning("trust on first use: %s presented the host key %s; recorded in %s and "
                            "pinned from now on. Compare it with the machine's own fingerprint "
                            "(ssh-keygen -lf /etc/ssh/ssh_host_%s_key.pub on it): a first "
                            "connection cannot tell the machine from an impostor", label, key,
                            self.path, key.key_type.removeprefix("ssh-"))
                return
        if old.key != key:
            raise AuthError(f"{label}: host key changed: it presented {key}, but {old.key} is trusted "
                            f"({old.how}, since {old.since or 'unknown'}) in {self.path}; refusing to "
                            "connect. If the machine was really reinstalled, check the new "
                            "fingerprint on it and remove its line from that file", provider="ssh")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = ["FleetKey", "KeyPair", "KnownHosts", "PublicKey", "TrustEntry",
           "check_file", "ensure_private_dir", "fingerprint", "generate_ed25519", "host_id", "keys_dir",
           "secret_fragments"]
