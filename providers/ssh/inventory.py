"""The inventory of the user's machines: where each is, how to log in, what it has.

A JSON file (``FLOWMESH_SSH_INVENTORY``)::

    {"hosts": [{"name": "box1", "host": "10.0.0.5", "port": 22, "user": "root",
                "key_path": "~/.ssh/id_ed25519", "host_key": "ssh-ed25519 AAAA...",
                "cpus": 32, "memory_gb": 128, "arch": "x86_64"}]}

``host_key`` is the machine's public host key line, pinned.  It may be left out: the key
is then trusted on first use (recorded in ``$FLOWMESH_HOME/keys/known_hosts`` with a
WARNING naming the machine and the key's fingerprint) and pinned from then on; a later
different key is refused (``AuthError``).  Giving it is safer: see docs/ssh.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.remote.keys import PublicKey
from flowmesh_sdk.specs import ARCHES, check_choice, check_name, check_number


@dataclass(frozen=True, slots=True)
class SshHost:
    name: str
    host: str
    key_path: str
    host_key: str | None
    cpus: int
    memory_gb: float
    port: int = 22
    user: str = "root"
    arch: str = "x86_64"

    def __post_init__(self) -> None:
        check_name("ssh.hosts[].name", self.name)
        if not isinstance(self.host, str) or not self.host:
            raise SpecError(f"ssh.hosts[{self.name}].host", "must be a host name or address")
        check_number(f"ssh.hosts[{self.name}].port", self.port, lo=1, hi=65535, integer=True)
        check_number(f"ssh.hosts[{self.name}].cpus", self.cpus, lo=1, hi=4096, integer=True)
        check_number(f"ssh.hosts[{self.name}].memory_gb", self.memory_gb, lo=0, lo_open=True)
        check_choice(f"ssh.hosts[{self.name}].arch", self.arch, ARCHES)
        if self.host_key is not None:
            # the whole line must parse (type, base64 blob of that type): a typo here would
            # otherwise only show up as a refused connection
            PublicKey.parse(self.host_key, field_name=f"ssh.hosts[{self.name}].host_key")
        object.__setattr__(self, "key_path", os.path.expanduser(self.key_path))


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
            hosts.append(SshHost(**{"host_key": None, **row}))   # no host_key: trust on first use
        except TypeError as exc:
            raise SpecError(f"ssh.hosts[{i}]", str(exc)) from exc
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        raise SpecError("ssh.hosts[].name", f"names must be unique, got {names}")
    return hosts
