"""How the SSH runner decides on a server's host key, for the target and for every jump host.

Three sources, in this order, and nothing is ever added to the user's files:

1. **pinned** (:attr:`HostTrust.pinned`): the key the SDK injected at launch
   (:mod:`.injection`) or the inventory's ``host_key``.  Only that key type is negotiated
   and exactly that key is accepted; anything else is refused before authentication.
   Jump hosts are never pinned by it (the pin is the target's).
2. **the user's known_hosts** (:mod:`.known_hosts`): the files the ssh config names
   (``UserKnownHostsFile``, ``GlobalKnownHostsFile``) or OpenSSH's defaults, or the files
   given in :attr:`HostTrust.known_hosts_files`: hashed names, patterns,
   ``@cert-authority`` host certificates and ``@revoked`` keys, as OpenSSH reads them.
3. **trust on first use**, only when asked for (:attr:`HostTrust.tofu`, the SDK's own
   trust record :class:`~flowmesh_sdk.remote.keys.KnownHosts`): a host found in neither
   has its key recorded there with a WARNING (logger ``flowmesh.remote.keys``) and pinned
   from then on.  Without it such a host is refused, naming what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..errors import AuthError
from .keys import KnownHosts, PublicKey, host_id
from .known_hosts import DEFAULT_FILES, KNOWN, UserKnownHosts


@dataclass(frozen=True, slots=True)
class HostTrust:
    """The host-key decision for one target (and, without the pin, its jump hosts)."""

    pinned: PublicKey | None = None
    known_hosts_files: tuple[str, ...] | None = None
    tofu: KnownHosts | None = field(default=None, compare=False)
    name: str = ""   # how messages name the machine (e.g. "ssh host box1")

    def for_jump_host(self) -> HostTrust:
        return replace(self, pinned=None, name="")

    def known_hosts(self, ssh_config: dict | None = None) -> UserKnownHosts:
        """The known_hosts files for one hop: given ones, else its ssh config's, else OpenSSH's."""
        if self.known_hosts_files is not None:
            return UserKnownHosts(self.known_hosts_files)
        cfg = ssh_config or {}
        files = [p for k in ("userknownhostsfile", "globalknownhostsfile")
                 for p in str(cfg.get(k, "")).split()]
        return UserKnownHosts(files or DEFAULT_FILES)

    def key_types(self, known: UserKnownHosts, names: Sequence[str], available: Sequence[str],
                  label: str) -> list[str]:
        """The host key algorithms to negotiate, most wanted first."""
        if self.pinned is not None:
            kt = self.pinned.key_type
            wanted = ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"] if kt == "ssh-rsa" else [kt]
            usable = [k for k in wanted if k in available]
            if not usable:
                raise AuthError(f"{label}: pinned host key type {kt!r} is not supported by paramiko",
                                provider="ssh")
            return usable
        first = [k for k in known.preferred_types(names) if k in available]
        return first + [k for k in available if k not in first]

    def verify(self, known: UserKnownHosts, names: Sequence[str], key_type: str, blob: bytes,
               cert: bytes | None, label: str, principal: str) -> None:
        """Accept (return) or refuse (AuthError) the key a server presented; ``names[0]``
        is its known_hosts name (``host`` or ``[host]:port``), ``principal`` the name a
        host certificate must list."""
        if self.pinned is not None:
            got = PublicKey(key_type, blob)
            if got != self.pinned:
                raise AuthError(f"{label}: host key mismatch: the server presented {got}, the pinned key "
                                f"is {self.pinned}; refusing to connect", provider="ssh")
            return
        if known.verify(names, key_type, blob, cert, label, principal) == KNOWN:
            return
        if self.tofu is not None:
            self.tofu.check(names[0], PublicKey(key_type, blob), name=self.name or label)
            return
        raise AuthError(f"{label}: {names[0]} is not in known_hosts ({', '.join(map(str, known.paths))}); "
                        "refusing to connect. Add its key there (ssh-keyscan, checked against ssh-keygen -lf "
                        "/etc/ssh/ssh_host_ed25519_key.pub on the machine), give host_key, or ask for trust "
                        "on first use (trust_on_first_use)", provider="ssh")


def hop_names(host: str, port: int, ssh_config: dict | None = None) -> tuple[str, str]:
    """How known_hosts names a hop (``host`` or ``[host]:port``) and the principal its host
    certificate must list: its ``HostKeyAlias``, else its host name, as in OpenSSH."""
    name = (ssh_config or {}).get("hostkeyalias") or host
    return host_id(name, port), name
