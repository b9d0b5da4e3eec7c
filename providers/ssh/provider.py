"""The ssh provider: the user's own machines, each carved into instances of the asked
size (capacity accounted per machine across processes, as the local provider does for
this host), reached over SSH the way the user already reaches them: through fabric with
the user's ssh config (aliases, ``ProxyJump`` bastions, ``IdentityFile``, the ssh-agent),
host keys pinned by the inventory or checked against the user's known_hosts (trust on
first use only for hosts marked so), and sudo for a login user that is not root
(docs/ssh.md).

Launching allocates slices (no machine is created); terminating removes the slice's
containers on its machine and frees it.  Every slice carries the SDK's tags, so
``flowmesh gc --provider ssh`` finds what a crashed coordinator left behind.  A machine
that does not answer at termination still gets its slices freed (it may never come back),
but what they had on it is remembered (``unswept/`` beside the slice records) and a WARNING
says so; ``flowmesh gc -p ssh`` removes those containers once the machine answers again
(:meth:`SshProvider.leftovers`) and names the machines it could not reach.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from flowmesh_sdk import settings as _settings
from flowmesh_sdk import timers
from flowmesh_sdk.config import home_dir
from flowmesh_sdk.errors import CapacityError, FlowMeshError, SpecError
from flowmesh_sdk.provider import (LABEL_INSTANCE, TAG_FLEET, TAG_POOL, Capabilities, Instance, LaunchRequest,
                                   Leftover, LeftoverScan, ProviderState)
from flowmesh_sdk.remote.keys import KNOWN_HOSTS_NAME, KnownHosts
from flowmesh_sdk.remote.keys import keys_dir as default_keys_dir
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.remote.trust import HostTrust
from flowmesh_sdk.remote.runtime import ContainerRuntime, RuntimeConfig
from flowmesh_sdk.specs import InstanceSpec, Offer

from flowmesh_providers.local.records import RecordDir
from flowmesh_providers.local.slices import SlicedProvider

from .inventory import SshHost, load_inventory

if TYPE_CHECKING:
    from flowmesh_sdk.remote.connection import Resolved
    from flowmesh_sdk.remote.ssh import SshTarget

ENV_INVENTORY = "FLOWMESH_SSH_INVENTORY"
REGION = "byo"
ASK_TIMEOUT_S = 60.0   # how long gc waits for one machine to list or remove its leftovers
log = logging.getLogger("flowmesh.providers.ssh")


class SshProvider(SlicedProvider):
    name = "ssh"
    region = REGION
    capabilities = Capabilities(spot=False, gpus=False, stop_start=False, max_batch=256, remote=True, free=True)

    def __init__(self, hosts: Sequence[SshHost] | None = None, *, inventory: str | Path | None = None,
                 state_dir: str | Path | None = None, runtime_config: RuntimeConfig | None = None,
                 max_sessions: int = 10, keys_dir: str | Path | None = None,
                 ssh_config: str | Path | None = None,
                 known_hosts: Sequence[str | Path] | None = None) -> None:
        """``ssh_config``: the ssh config file to read (default: ``/etc/ssh/ssh_config`` and
        ``~/.ssh/config``, as ``ssh`` reads them; ``""``: none).  ``known_hosts``: the
        known_hosts files that decide on hosts without a pinned ``host_key`` (default: the
        ssh config's ``UserKnownHostsFile``/``GlobalKnownHostsFile``, else OpenSSH's).
        ``keys_dir`` holds the trust record of hosts marked ``trust_on_first_use``
        (default ``$FLOWMESH_HOME/keys``; see :mod:`flowmesh_sdk.remote.keys`)."""
        if hosts is None:
            path = inventory or _settings.value("providers.ssh.inventory")
            if not path:
                raise SpecError("ssh.inventory", f"give hosts=, inventory= or set {ENV_INVENTORY} "
                                                 "to a JSON inventory of your machines")
            hosts = load_inventory(path)
        self.hosts = {h.name: h for h in hosts}
        self._records = RecordDir(Path(state_dir) if state_dir else home_dir() / "ssh" / "instances")
        #: instances terminated while their machine did not answer: their containers are still there
        self._unswept = RecordDir(self._records.root / "unswept")
        self._runtime_config = runtime_config
        self._max_sessions = max_sessions
        self._runners: dict[str, Runner] = {}
        self._keys_dir = Path(keys_dir) if keys_dir is not None else None
        self._ssh_config = None if ssh_config is None else os.path.expanduser(str(ssh_config))
        self._known_hosts = None if known_hosts is None else tuple(str(p) for p in known_hosts)

    def __repr__(self) -> str:
        return f"SshProvider(hosts={sorted(self.hosts)})"

    def _offer(self, spec: InstanceSpec) -> Offer:
        return Offer(provider="ssh", region=REGION, instance_type=f"ssh-{spec.cpus}c-{spec.memory_gb:g}g",
                     cpus=spec.cpus, memory_gb=spec.memory_gb, price_per_hour=0.0, arch=spec.arch)

    def _fits(self, host: SshHost, spec: InstanceSpec) -> bool:
        return (spec.cpus <= host.cpus and spec.memory_gb <= host.memory_gb + 1e-9 and not spec.gpus
                and spec.arch == host.arch)

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        return [self._offer(spec)] if any(self._fits(h, spec) for h in self.hosts.values()) else []

    def explain_misfit(self, spec: InstanceSpec) -> str:
        sizes = ", ".join(f"{h.name}: {h.cpus} cpus / {h.memory_gb:g} GB / {h.arch}"
                          for h in self.hosts.values())
        return f"no machine in the inventory is that large ({sizes})"

    def _port_of(self, address: str | None) -> int | None:
        host = self.hosts.get(address or "")
        return host.port if host is not None else None

    # ---- where slices go, and how they are cleared ---------------------------------------
    def _place(self, live: list[Instance], request: LaunchRequest) -> list[str | None]:
        spec = request.spec
        used = {name: [0.0, 0.0] for name in self.hosts}
        for inst in live:
            if inst.address in used:
                used[inst.address][0] += inst.spec.cpus
                used[inst.address][1] += inst.spec.memory_gb
        chosen: list[str | None] = []
        bad = self.quarantined()
        for _ in range(request.count):
            free = [(h.cpus - used[h.name][0], h.name) for h in self.hosts.values()
                    if h.name not in bad and self._fits(h, spec) and used[h.name][0] + spec.cpus <= h.cpus
                    and used[h.name][1] + spec.memory_gb <= h.memory_gb + 1e-9]
            if not free:
                held = f" ({', '.join(sorted(bad))} held back as unhealthy)" if bad else ""
                raise CapacityError(f"the inventory has room for {len(chosen)} of the "
                                    f"{request.count} instances of {spec.cpus} cpus / "
                                    f"{spec.memory_gb:g} GB asked{held}", provider="ssh",
                                    code="InventoryFull")
            _, name = max(free)   # the machine with the most free cpus
            used[name][0] += spec.cpus
            used[name][1] += spec.memory_gb
            chosen.append(name)
        return chosen

    async def _remove_containers(self, instances: list[Instance]) -> None:
        by_host: dict[str, list[Instance]] = {}
        for inst in instances:
            by_host.setdefault(inst.address or "", []).append(inst)
        for name, insts in by_host.items():
            if name not in self.hosts:
                continue
            wanted = {i.id for i in insts}
            runtime = self._runtime(name)
            try:
                containers = [c.id for c in await runtime.list(label_keys=[LABEL_INSTANCE])
                              if c.labels.get(LABEL_INSTANCE) in wanted]
                await runtime.remove(containers)
            except FlowMeshError as exc:
                # free the slices anyway (the machine may never come back), but remember what
                # they had there: `flowmesh gc -p ssh` removes it once the machine answers
                await asyncio.to_thread(self._remember, insts)
                log.warning("ssh host %s did not answer at termination (%s): the containers of %s stay on it "
                            "until `flowmesh gc -p ssh` removes them once it answers", name, exc,
                            ", ".join(sorted(wanted)))

    def _runtime(self, name: str) -> ContainerRuntime:
        return ContainerRuntime(self._runner_for(name), self._runtime_config)

    def _remember(self, insts: list[Instance]) -> None:
        with self._unswept.locked():
            for inst in insts:
                self._unswept.write(dataclasses.replace(inst, state=ProviderState.TERMINATED))

    def _forget(self, ids: set[str]) -> None:
        with self._unswept.locked():
            for i in ids:
                self._unswept.remove(i)

    async def leftovers(self, fleet: str | None = None) -> LeftoverScan:
        """The containers of terminated instances still on machines that did not answer at
        their termination, asking each such machine (at most ``ASK_TIMEOUT_S`` each, all at
        once); ``unreachable`` names the machines that do not answer now either."""
        pending = await asyncio.to_thread(self._unswept.all)
        by_host: dict[str, list[Instance]] = {}
        for inst in pending:
            if fleet is None or inst.tags.get(TAG_FLEET, "") == fleet:
                by_host.setdefault(inst.address or "", []).append(inst)
        scans = await asyncio.gather(*(self._scan(name, insts) for name, insts in sorted(by_host.items())))
        return LeftoverScan(self.name, tuple(lo for s in scans for lo in s.found),
                            tuple(u for s in scans for u in s.unreachable),
                            tuple(i for s in scans for i in s.settled))

    async def _scan(self, name: str, insts: list[Instance]) -> LeftoverScan:
        if name not in self.hosts:
            return LeftoverScan(self.name, unreachable=((name, "no longer in the inventory"),))
        by_id = {i.id: i for i in insts}
        try:
            async with timers.timeout(ASK_TIMEOUT_S):
                listed = await self._runtime(name).list(label_keys=[LABEL_INSTANCE])
        except (FlowMeshError, OSError, TimeoutError) as exc:
            return LeftoverScan(self.name, unreachable=((name, f"{type(exc).__name__}: {exc}"),))
        found = tuple(Leftover(name, c.labels[LABEL_INSTANCE], c.id, c.name,
                               by_id[c.labels[LABEL_INSTANCE]].tags.get(TAG_FLEET, ""),
                               by_id[c.labels[LABEL_INSTANCE]].tags.get(TAG_POOL, ""))
                      for c in listed if c.labels.get(LABEL_INSTANCE) in by_id)
        there = {lo.instance_id for lo in found}
        return LeftoverScan(self.name, found, settled=tuple(i for i in by_id if i not in there))

    async def remove_leftovers(self, scan: LeftoverScan) -> LeftoverScan:
        """Remove what :meth:`leftovers` found; an instance none of whose containers is left
        (``settled``) is forgotten.  Returns what is still there and the machines that did
        not answer."""
        by_host: dict[str, list[Leftover]] = {}
        for lo in scan.found:
            by_host.setdefault(lo.machine, []).append(lo)
        still: list[Leftover] = []
        unreachable = list(scan.unreachable)
        settled = set(scan.settled)
        for name, items in sorted(by_host.items()):
            if name not in self.hosts:
                still += items
                continue
            runtime = self._runtime(name)
            try:
                async with timers.timeout(ASK_TIMEOUT_S):
                    await runtime.remove([lo.container_id for lo in items])
                    left = {c.id for c in await runtime.list(label_keys=[LABEL_INSTANCE])}
            except (FlowMeshError, OSError, TimeoutError) as exc:
                unreachable.append((name, f"{type(exc).__name__}: {exc}"))
                still += items
                continue
            kept = [lo for lo in items if lo.container_id in left]
            still += kept
            settled |= {lo.instance_id for lo in items} - {lo.instance_id for lo in kept}
        await asyncio.to_thread(self._forget, settled)
        return LeftoverScan(self.name, tuple(still), tuple(unreachable), tuple(sorted(settled)))

    def runner(self, instance: Instance) -> Runner:
        if instance.address not in self.hosts:
            raise SpecError("ssh.hosts", f"instance {instance.id} is on {instance.address!r}, "
                                         "which is not in the inventory")
        return self._runner_for(instance.address)

    def resolved(self, name: str) -> Resolved:
        """Where the inventory host ``name`` really goes once the ssh config applies (host,
        port, user, jump hosts): config files are read, nothing is connected to."""
        return where(self.hosts[name], ssh_config=self._ssh_config)

    def _runner_for(self, name: str) -> Runner:
        if name not in self._runners:
            from flowmesh_sdk.remote.ssh import SshRunner  # fabric is the [ssh] extra
            h = self.hosts[name]
            tofu = None
            if h.trust_on_first_use:   # asked for: recorded with a WARNING, then pinned (docs/ssh.md)
                tofu = KnownHosts((self._keys_dir or default_keys_dir()) / KNOWN_HOSTS_NAME)
            trust = HostTrust(known_hosts_files=self._known_hosts, tofu=tofu, name=f"ssh host {name}")
            target = _target(h, self._ssh_config)
            self._runners[name] = SshRunner(target, max_sessions=self._max_sessions, trust=trust,
                                            sudo_password=h.sudo_password())
        return self._runners[name]

    async def close(self) -> None:
        for r in self._runners.values():
            await r.close()
        self._runners.clear()


def _target(h: SshHost, ssh_config: str | None) -> SshTarget:
    from flowmesh_sdk.remote.ssh import SshTarget  # fabric is the [ssh] extra
    return SshTarget(h.host, h.port, h.user, h.key_path, h.host_key or "", ssh_config=ssh_config, sudo=h.sudo)


def where(host: SshHost, *, ssh_config: str | None = None) -> Resolved:
    """Where ``host`` really goes once the ssh config (``ssh_config``, default the user's)
    applies: a host named by its config alias alone gets its HostName, User and Port."""
    from flowmesh_sdk.remote.connection import build, resolve
    # the key plays no part in where a host is (and need not be readable to plan)
    return resolve(build(dataclasses.replace(_target(host, ssh_config), key_path=None)))
