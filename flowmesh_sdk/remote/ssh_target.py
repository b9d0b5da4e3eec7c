"""Where and how to reach a machine over SSH: :class:`SshTarget`.

A plain record (no fabric, no paramiko): :mod:`.connection` builds a connection for it and
:class:`~flowmesh_sdk.remote.ssh.SshRunner` runs commands on it.  It is re-exported from
:mod:`.ssh`, where it was defined first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError
from .hostnames import check_host, check_user

__all__ = ["SshTarget"]


@dataclass(frozen=True, slots=True)
class SshTarget:
    """Where and how to reach a machine.

    ``host`` is an address or a host alias of the ssh config; ``port``, ``user`` and
    ``key_path`` (the client's private key file, never its contents) override the
    config when given (None: the config's, else 22, the local user, the agent and
    ``~/.ssh/id_*``).  ``host_key`` is the server's expected public key line
    (``ssh-ed25519 AAAA...``), pinned; empty, the user's known_hosts decides
    (:class:`~flowmesh_sdk.remote.trust.HostTrust`).  ``ssh_config`` is the ssh config
    file to read (None: ``/etc/ssh/ssh_config`` and ``~/.ssh/config``; ``""``: none).
    ``sudo``: every command runs as root through sudo (a login user that is not root).

    ``host`` and ``user`` are refused (:class:`SpecError` on ``ssh.host`` / ``ssh.user``)
    where OpenSSH's ``ssh`` refuses them on its command line: a leading ``-``, whitespace,
    control characters, shell metacharacters (:mod:`.hostnames`)."""

    host: str
    port: int | None = None
    user: str | None = None
    key_path: str | None = None
    host_key: str = field(default="", repr=False)
    ssh_config: str | None = None
    sudo: bool = False

    def __post_init__(self) -> None:
        check_host("ssh.host", self.host)
        if self.user is not None:
            check_user("ssh.user", self.user)
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise SpecError("ssh.port", f"must be a port number 1-65535 (or None: the ssh config's); "
                                        f"got {self.port!r}")

    @property
    def label(self) -> str:
        where = self.host if self.port is None else f"{self.host}:{self.port}"
        return f"{self.user}@{where}" if self.user else where
