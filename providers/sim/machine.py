"""A simulated machine: a :class:`~flowmesh_sdk.remote.runner.Runner` that answers the
commands the real :class:`~flowmesh_sdk.remote.runtime.ContainerRuntime` and
:class:`~flowmesh_sdk.sandbox.Sandbox` send, on virtual time.

The point is that the real control plane runs unchanged above it: the runtime's probe,
``podman pull`` / ``run`` / ``rm`` / ``ps`` command lines, and the sandbox agent's framed
protocol over a held-open ``podman exec -i CTR /bin/sh`` channel are all parsed here and
answered the way podman and the agent would.  What takes time takes virtual time: a
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
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from flowmesh_sdk import clock
from flowmesh_sdk.errors import ProviderUnavailableError
from flowmesh_sdk.remote.runner import Channel, CommandResult, Runner, StreamChannel

from .network import Link, transfer

WORK = re.compile(rb"sim-work\s+([0-9]+(?:\.[0-9]+)?)(?:\s+(-?[0-9]+))?")
# the agent's framing (flowmesh_sdk.sandbox): a header line, then SCRIPT_LEN + STDIN_LEN bytes
_RUN = re.compile(rb"^__fm_run (\d+) ([0-9.]+) (\d+) (\d+) (\d+)(?: \d+)?\n")
# CapEff, ulimit -Hn, cgroups, runc, uid, max user namespaces, subuid `containers` lines, nsenter+ip
_PROBE_FACTS = "0000003fffffffff\n1048576\nv2\n/usr/bin/runc\n0\n63000\n0\nnetns\n"


def _ok(argv: Sequence[str], out: str = "", rc: int = 0, err: str = "") -> CommandResult:
    return CommandResult(tuple(argv), rc, out.encode(), err.encode(), 0.0)


@dataclass
class SimContainer:
    id: str
    name: str
    image: str
    labels: dict[str, str]
    channels: list[_AgentShell] = field(default_factory=list)


class SimMachine(Runner):
    """One simulated VM.  ``registry_sizes`` maps image digests to their bytes; ``nic``
    and ``egress`` are the links a pull crosses."""

    on_this_host = False

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
        """The machine vanishes: commands fail, open channels end."""
        self.alive = False
        for c in self.containers.values():
            for ch in c.channels:
                ch.hang_up()

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
            if "command -v" in script and "CapEff" not in script:
                return _ok(argv, "/usr/bin/podman\n")
            if "CapEff" in script:
                return _ok(argv, _PROBE_FACTS)
            return _ok(argv)
        if argv and argv[0] == "podman":
            return await self._podman(argv)
        return _ok(argv, rc=127, err=f"sim: {argv[0]}: not found")

    async def open_channel(self, argv: Sequence[str]) -> Channel:
        self._check()
        argv = list(argv)
        if argv == ["sh"]:
            return _EchoShell(self)
        if argv[:3] == ["podman", "exec", "-i"] and argv[3] in self.containers:
            c = self.containers[argv[3]]
            ch = _AgentShell(self)
            c.channels.append(ch)
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
        if sub == "version":
            return _ok(argv, "4.3.1-sim\n")
        if sub == "image" and argv[2:3] == ["inspect"]:
            digest = self._digest(argv[-1])
            if digest in self.images:
                return _ok(argv, f"{digest} {digest}\n")
            return _ok(argv, rc=125, err=f"Error: {argv[-1]}: image not known")
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
                    for ch in c.channels:
                        ch.hang_up()
            return _ok(argv)
        if sub == "ps":
            return _ok(argv, json.dumps(self._ps(argv)))
        return _ok(argv, rc=125, err=f"sim podman: unsupported {sub}")

    def _digest(self, ref: str) -> str:
        return ref.rsplit("@", 1)[-1] if "@" in ref else ref

    async def _run_container(self, argv: list[str]) -> CommandResult:
        name = argv[argv.index("--name") + 1]
        labels = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--label")
        image = argv[argv.index("--entrypoint") + 2]
        if self._digest(image) not in self.images:
            return _ok(argv, rc=125, err=f"Error: {image}: image not known")
        await asyncio.sleep(self.container_start_s)
        self._check()
        self._ids += 1
        cid = f"{self.name}-c{self._ids:06d}"
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


class _SimChannel(StreamChannel):
    def __init__(self, machine: SimMachine) -> None:
        self.machine = machine
        self._out = asyncio.StreamReader()
        err = asyncio.StreamReader()
        err.feed_eof()
        super().__init__(self._out, err)
        self._open = True

    @property
    def alive(self) -> bool:
        return self._open and self.machine.alive

    def hang_up(self) -> None:
        if self._open:
            self._open = False
            self._out.feed_eof()

    async def close(self) -> None:
        self.hang_up()


class _EchoShell(_SimChannel):
    """``sh`` on the machine, for bootstrap's agent step: answers ``echo WORD``."""

    async def write(self, data: bytes) -> None:
        self.machine._check()
        for line in data.splitlines():
            if line.startswith(b"echo "):
                self._out.feed_data(line[5:] + b"\n")


class _AgentShell(_SimChannel):
    """The sandbox agent inside a container: ``__FM_READY__`` after the agent script,
    then one framed answer per ``__fm_run``."""

    def __init__(self, machine: SimMachine) -> None:
        super().__init__(machine)
        self._tasks: set[asyncio.Task[None]] = set()
        self._buf = b""

    async def write(self, data: bytes) -> None:
        self.machine._check()
        if not self._open:
            raise ProviderUnavailableError(f"{self.machine.label}: channel closed", provider="sim")
        if b"echo __FM_READY__" in data:
            self._out.feed_data(b"__FM_READY__\n")
            return
        self._buf += data
        while True:
            m = _RUN.match(self._buf)
            if m is None:
                if b"\n" in self._buf and not self._buf.startswith(b"__fm_run "):
                    self._buf = b""               # not a frame: dropped, as the agent would
                return
            end = m.end() + int(m.group(4)) + int(m.group(5))
            if len(self._buf) < end:
                return                            # the rest of the payload is still coming
            script = self._buf[m.end():m.end() + int(m.group(4))]
            self._buf = self._buf[end:]
            self._start(int(m.group(1)), float(m.group(2)), int(m.group(3)), script)

    def _start(self, ident: int, timeout: float, cap: int, script: bytes) -> None:
        t = asyncio.ensure_future(self._answer(ident, timeout, cap, script))
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _answer(self, ident: int, timeout: float, cap: int, script: bytes) -> None:
        w = WORK.search(script)
        seconds, rc, out = 0.0, 0, b""
        if w is not None:
            seconds, rc, out = float(w.group(1)), int(w.group(2) or 0), b"ok\n"
        timed_out = seconds > timeout
        t0 = clock.monotonic()
        if timed_out:
            seconds, rc, out = timeout, 137, b""
        if seconds:
            await asyncio.sleep(seconds)
        if not self.alive:
            return
        self.machine.work_done_s += clock.monotonic() - t0
        out = out[:cap]
        self._out.feed_data(f"__FM__ {ident} {rc} {int(timed_out)} {len(out)} 0\n".encode() + out)

    def hang_up(self) -> None:
        for t in self._tasks:
            t.cancel()
        super().hang_up()
