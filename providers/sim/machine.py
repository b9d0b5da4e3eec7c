"""A simulated machine: a :class:`~flowmesh_sdk.remote.runner.Runner` that answers the
commands the real :class:`~flowmesh_sdk.remote.runtime.ContainerRuntime` and
:class:`~flowmesh_sdk.sandbox.Sandbox` send, on virtual time.

The point is that the real control plane runs unchanged above it: the runtime's probe,
``podman pull`` / ``run`` / ``rm`` / ``ps`` command lines, and the sandbox agent's framed
protocol over a held-open channel -- ``podman exec -i CTR /bin/sh``, or the shell of a
container started attached (``podman run -i``) -- (:mod:`.agent`: exec, streamed
processes and session shells) are all parsed here and answered the way podman
and the agent would.  What takes time takes virtual time: a
pull crosses the machine's NIC and the registry's egress (:mod:`.network`), a container
start costs ``container_start_s``, and a task's command ``sim-work SECONDS [EXIT]`` runs
for that long.  Any other script succeeds at once (file writes, ``true``).

A machine can die (a spot interruption, or :meth:`kill`): from then on every command
fails with ``ProviderUnavailableError`` and every open channel hits end-of-file, as an
SSH connection to a vanished VM would.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Sequence

from flowmesh_sdk.errors import ProviderUnavailableError
from flowmesh_sdk.remote.runner import Channel, CommandResult, Runner
from flowmesh_sdk.remote.runtime_config import ATTACHED_UP, PROBE_SECTION
from flowmesh_sdk.remote.runtime_images import PULL_SCRIPT

from .agent import AgentShell, EchoShell, FailedChannel, SimContainer
from .network import Link, transfer

__all__ = ["SimContainer", "SimMachine"]   # SimContainer lives in .agent now (beside the shells it holds)

# the runtime probe's answer: podman's path and version, then CapEff, ulimit -Hn, cgroups, runc,
# uid, max user namespaces, subuid `containers` lines, nsenter+ip (ContainerRuntime.probe)
_PROBE = (f"/usr/bin/podman\n4.3.1-sim\n{PROBE_SECTION}\n"
          "0000003fffffffff\n1048576\nv2\n/usr/bin/runc\n0\n63000\n0\nnetns\n")


def _ok(argv: Sequence[str], out: str = "", rc: int = 0, err: str = "") -> CommandResult:
    return CommandResult(tuple(argv), rc, out.encode(), err.encode(), 0.0)


class SimMachine(Runner):
    """One simulated VM.  ``registry_sizes`` maps image digests to their bytes; ``nic``
    and ``egress`` are the links a pull crosses."""

    on_this_host = False
    needs_heartbeat = False   # a simulated machine never hangs silently: kill() ends its channels

    def __init__(self, name: str, *, nic: Link, egress: Link | None,
                 registry_sizes: dict[str, int], container_start_s: float = 0.5) -> None:
        self.label = f"sim:{name}"
        self.name = name
        self.nic = nic
        self.egress = egress
        self.registry_sizes = registry_sizes
        self.container_start_s = container_start_s
        self.images: set[str] = set()                # digests held
        self.containers: dict[str, SimContainer] = {}
        self.alive = True
        self._ids = 0
        self.work_done_s = 0.0                       # virtual seconds of sim-work run here

    def __repr__(self) -> str:
        return f"SimMachine({self.name}, {'up' if self.alive else 'dead'})"

    def kill(self) -> None:
        """The machine vanishes: commands fail, open channels end, and what it held goes
        with it (its provider keeps the VM's record for an hour, not its containers)."""
        self.alive = False
        for c in self.containers.values():
            for ch in list(c.channels):
                ch.hang_up()
        self.containers.clear()
        self.images.clear()

    def _check(self) -> None:
        if not self.alive:
            raise ProviderUnavailableError(f"{self.label}: connection refused (machine gone)",
                                           provider="sim")

    # ---- the Runner contract ---------------------------------------------------------
    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  input: bytes | None = None) -> CommandResult:
        self._check()
        argv = list(argv)
        if argv == ["true"]:
            return _ok(argv)
        if argv[:2] == ["sh", "-c"]:
            script = argv[2]
            if script == PULL_SCRIPT:   # sh -c PULL_SCRIPT sh BINARY REF FORMAT [FLAGS]: inspect, else pull
                ref = argv[5]
                if self._digest(ref) in self.images:
                    return _ok(argv)
                res = await self._podman(["podman", "pull", ref])
                return _ok(argv, "pulled\n\n") if res.ok else res
            if PROBE_SECTION in script:
                return _ok(argv, _PROBE)
            return _ok(argv)
        if argv and argv[0] == "podman":
            return await self._podman(argv)
        return _ok(argv, rc=127, err=f"sim: {argv[0]}: not found")

    async def open_channel(self, argv: Sequence[str]) -> Channel:
        self._check()
        argv = list(argv)
        if argv == ["sh"]:
            return EchoShell(self)
        if argv[:3] == ["podman", "exec", "-i"] and argv[3] in self.containers:
            return self._attach(self.containers[argv[3]])
        if argv[:3] == ["podman", "run", "-i"]:   # a container started attached: its shell
            res = await self._run_container(argv, key="name")
            if not res.ok:
                return FailedChannel(self, res.stderr)
            ch = self._attach(self.containers[res.text().strip()])
            ch.say(ATTACHED_UP)
            return ch
        raise ProviderUnavailableError(f"{self.label}: cannot open {shlex.join(argv)}", provider="sim")

    async def put_file(self, local_path: str, remote_path: str) -> None:
        self._check()

    async def get_file(self, remote_path: str, local_path: str) -> None:
        self._check()
        raise ProviderUnavailableError(f"{self.label}: no files to fetch in a simulation", provider="sim")

    # ---- podman ----------------------------------------------------------------------
    async def _podman(self, argv: list[str]) -> CommandResult:
        sub = argv[1] if len(argv) > 1 else ""
        if sub == "pull":
            ref = argv[-1]
            digest = self._digest(ref)
            if digest not in self.registry_sizes:
                return _ok(argv, rc=125, err=f"Error: {ref}: manifest unknown")
            if digest not in self.images:
                await transfer(self.registry_sizes[digest], self.nic, self.egress)
                self._check()
                self.images.add(digest)
            return _ok(argv, digest + "\n")
        if sub == "rmi":
            self.images.discard(self._digest(argv[-1]))
            return _ok(argv)
        if sub == "run":
            return await self._run_container(argv)
        if sub == "exec":
            return _ok(argv)                  # exec_once: kill -9 -1 and friends
        if sub == "rm":
            for cid in argv[2:]:
                c = self.containers.pop(cid, None)
                if c is not None:
                    for ch in list(c.channels):
                        ch.hang_up()
            return _ok(argv)
        if sub == "ps":
            return _ok(argv, json.dumps(self._ps(argv)))
        return _ok(argv, rc=125, err=f"sim podman: unsupported {sub}")

    def _digest(self, ref: str) -> str:
        return ref.rsplit("@", 1)[-1] if "@" in ref else ref

    def _attach(self, c: SimContainer) -> AgentShell:
        ch = AgentShell(self, c)
        c.channels.append(ch)
        return ch

    async def _run_container(self, argv: list[str], *, key: str = "id") -> CommandResult:
        """``run``: the container, known by a new id (``run -d``, which prints it) or by its
        name (``key="name"``: ``run -i``, where the runtime names it by its name)."""
        name = argv[argv.index("--name") + 1]
        labels = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")
        image = argv[argv.index("--entrypoint") + 2]
        if self._digest(image) not in self.images:
            return _ok(argv, rc=125, err=f"Error: {image}: image not known")
        await asyncio.sleep(self.container_start_s)
        self._check()
        self._ids += 1
        cid = name if key == "name" else f"{self.name}-c{self._ids:06d}"
        self.containers[cid] = SimContainer(cid, name, image, labels)
        return _ok(argv, cid + "\n")

    def _ps(self, argv: list[str]) -> list[dict[str, object]]:
        wanted = [argv[i + 1].removeprefix("label=") for i, a in enumerate(argv) if a == "--filter"]

        def match(c: SimContainer) -> bool:
            for w in wanted:
                k, _, v = w.partition("=")
                if k not in c.labels or (v and c.labels[k] != v):
                    return False
            return True
        return [{"Id": c.id, "Names": [c.name], "Image": c.image, "State": "running",
                 "Labels": c.labels} for c in self.containers.values() if match(c)]
