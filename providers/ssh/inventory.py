"""The inventory of the user's machines: where each is, how to log in, what it has.

A JSON file (``FLOWMESH_SSH_INVENTORY``)::

    {"hosts": [{"name": "gpu1", "cpus": 32, "memory_gb": 128},
               {"name": "box2", "host": "10.0.0.5", "port": 2222, "user": "ubuntu",
                "key_path": "~/.ssh/id_ed25519", "sudo": true,
                "cpus": 16, "memory_gb": 64, "arch": "x86_64"}]}

``host`` is an address or a host alias of the ssh config (default: ``name``, so a host
the ssh config already describes needs nothing but its size), and ``user`` a login name;
both are refused where OpenSSH's ``ssh`` refuses them on its command line (a leading
``-``, whitespace, control characters, shell metacharacters:
:mod:`flowmesh_sdk.remote.hostnames`); ``port``, ``user`` and
``key_path`` override the config when given (left out: the config's ``Port``, ``User``,
``IdentityFile``, else 22, the local user, the ssh-agent and ``~/.ssh/id_*``).  Jump
hosts (``ProxyJump``) come from the config.

Host keys: ``host_key`` (the machine's public host key line) is pinned when given;
left out, the user's known_hosts decides (hashed entries, ``@cert-authority``,
``@revoked``), and a machine it does not list is refused -- unless
``"trust_on_first_use": true``: then its key is recorded in
``$FLOWMESH_HOME/keys/known_hosts`` with a WARNING and pinned from then on.  See
docs/ssh.md.

``sudo``: the login user is not root; every command runs through sudo, passwordless,
or with the password read from the environment variable ``sudo_password_env`` names
(never written in the inventory).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.remote.hostnames import check_host, check_user
from flowmesh_sdk.remote.keys import PublicKey
from flowmesh_sdk.specs import ARCHES, check_choice, check_name, check_number


@dataclass(frozen=True, slots=True)
class SshHost:
    name: str
    cpus: int
    memory_gb: float
    host: str = ""
    port: int | None = None
    user: str | None = None
    key_path: str | None = None
    host_key: str | None = None
    arch: str = "x86_64"
    trust_on_first_use: bool = False
    sudo: bool = False
    sudo_password_env: str | None = None

    def __post_init__(self) -> None:
        check_name("ssh.hosts[].name", self.name)
        f = f"ssh.hosts[{self.name}]"
        if not self.host:
            object.__setattr__(self, "host", self.name)   # the ssh config's alias
        check_host(f"{f}.host", self.host)   # as OpenSSH's ssh checks its command line
        if self.port is not None:
            check_number(f"{f}.port", self.port, lo=1, hi=65535, integer=True)
        if self.user is not None:
            check_user(f"{f}.user", self.user)
        check_number(f"{f}.cpus", self.cpus, lo=1, hi=4096, integer=True)
        check_number(f"{f}.memory_gb", self.memory_gb, lo=0, lo_open=True)
        check_choice(f"{f}.arch", self.arch, ARCHES)
        for flag in ("trust_on_first_use", "sudo"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{f}.{flag}", "must be true or false")
        if self.sudo_password_env is not None and (
                not self.sudo or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(self.sudo_password_env))):
            raise SpecError(f"{f}.sudo_password_env", "must name an environment variable (and needs sudo: true)")
        if self.host_key is not None:
            # the whole line must parse (type, base64 blob of that type): a typo here would
            # otherwise only show up as a refused connection
            PublicKey.parse(self.host_key, field_name=f"{f}.host_key")
            if self.trust_on_first_use:
                raise SpecError(f"{f}.trust_on_first_use", "a pinned host_key is never trusted on first use")
        if self.key_path is not None:
            object.__setattr__(self, "key_path", os.path.expanduser(self.key_path))

    def sudo_password(self) -> str | None:
        """The sudo password from the environment (None: passwordless sudo)."""
        if self.sudo_password_env is None:
            return None
        value = os.environ.get(self.sudo_password_env)
        if value is None:
            raise SpecError(f"ssh.hosts[{self.name}].sudo_password_env",
                            f"the environment variable {self.sudo_password_env} is not set")
        return value


def load_inventory(path: str | Path) -> list[SshHost]:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SpecError("ssh.inventory", f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise SpecError("ssh.inventory", f"{path} is not JSON: {exc}") from exc
    rows = data.get("hosts") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise SpecError("ssh.inventory", f'{path} must hold {{"hosts": [...]}} with at least one host')
    hosts = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SpecError(f"ssh.hosts[{i}]", "must be an object")
        try:
            hosts.append(SshHost(**row))
        except TypeError as exc:
            raise SpecError(f"ssh.hosts[{i}]", str(exc)) from exc
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise SpecError("ssh.hosts[].name", f"names must be unique, got {names}")
    return hosts
