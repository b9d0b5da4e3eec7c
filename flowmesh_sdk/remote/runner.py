"""Runners run commands on one machine.  They know nothing of clouds or containers.

A :class:`Runner` runs a command with a deadline, moves files, and opens long-lived
:class:`Channel` processes (stdin/stdout pipes) that the container runtime uses to hold
a shell open inside a container.  :class:`~flowmesh_sdk.remote.local.LocalRunner`
runs on this host; :class:`~flowmesh_sdk.remote.ssh.SshRunner` implements the same
contract over SSH (session channels on a ``fabric.Connection``'s transport: the user's
ssh config, jump hosts and agent; see :mod:`~flowmesh_sdk.remote.connection`).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from .. import timers
from ..errors import ProviderUnavailableError, SandboxClosedError


@dataclass(frozen=True, slots=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: bytes = field(repr=False)
    stderr: bytes = field(repr=False)
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    def describe(self) -> str:
        """One line for error messages: the command, its exit and the tail of stderr."""
        err = self.stderr.decode("utf-8", "replace").strip().splitlines()
        tail = err[-1] if err else ""
        how = "timed out" if self.timed_out else f"exit {self.exit_code}"
        return f"`{shlex.join(self.argv)[:200]}` {how}" + (f": {tail[:400]}" if tail else "")


class Channel(abc.ABC):
    """A long-lived process on a machine, spoken to over its stdin and stdout."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def readline(self) -> bytes:
        """One line including its newline; b"" at end of stream."""

    @abc.abstractmethod
    async def readexactly(self, n: int) -> bytes: ...

    @abc.abstractmethod
    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes, as soon as there are any; b"" at end of stream."""

    @property
    @abc.abstractmethod
    def alive(self) -> bool: ...

    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The last lines the process wrote to stderr (for diagnostics)."""

    async def last_words(self, wait_s: float = 1.0) -> str:
        """:meth:`stderr_tail` once the process's stderr has ended (at most ``wait_s``):
        what a process that just exited said, read to its end."""
        return self.stderr_tail()

    @abc.abstractmethod
    async def close(self) -> None: ...

    async def kill(self) -> None:
        """End the channel now: its process is killed, not given time to exit by itself (a
        process that outlives its standard input, such as the client of an attached
        container, :meth:`ContainerRuntime.start <flowmesh_sdk.remote.runtime.ContainerRuntime.start>`).
        Default: :meth:`close`."""
        await self.close()

    @abc.abstractmethod
    def abort(self, exc: Exception) -> None:
        """The machine behind this channel was declared lost: every read waiting on it, and
        every later one, raises ``exc`` now; nothing is sent.  :meth:`close` still follows."""


class StreamChannel(Channel):
    """A channel whose process speaks over asyncio streams: stdout is read by the caller,
    stderr is drained into a short tail for error messages."""

    def __init__(self, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self._stdout = stdout
        self._err: collections.deque[str] = collections.deque(maxlen=20)
        self._drain = asyncio.create_task(self._drain_stderr(stderr))

    async def _drain_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            self._err.append(line.decode("utf-8", "replace").rstrip())

    async def readline(self) -> bytes:
        return await self._stdout.readline()

    async def read(self, n: int) -> bytes:
        return await self._stdout.read(n)

    async def readexactly(self, n: int) -> bytes:
        try:
            return await self._stdout.readexactly(n)
        except asyncio.IncompleteReadError as exc:
            raise SandboxClosedError(f"channel closed mid-read: {self.stderr_tail()}") from exc

    def stderr_tail(self) -> str:
        return " | ".join(self._err) or "(no stderr)"

    async def last_words(self, wait_s: float = 1.0) -> str:
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._drain), wait_s)
        return self.stderr_tail()

    def abort(self, exc: Exception) -> None:
        self._stdout.set_exception(exc)


class Runner(abc.ABC):
    """Runs commands on one machine."""

    #: a short label for messages, e.g. ``local`` or ``root@127.0.0.2:22``
    label: str = "runner"
    #: True when commands run on this host (its container store is this host's)
    on_this_host: bool = False
    #: False when the machine cannot hang unnoticed (this host; a simulated machine, whose
    #: failures end its channels): a pool's heartbeat (:mod:`flowmesh_sdk.pools.heartbeat`)
    #: then never probes it
    needs_heartbeat: bool = True

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  input: bytes | None = None) -> CommandResult:
        """Run ``argv``; on timeout kill its whole process tree and return ``timed_out``."""

    @abc.abstractmethod
    async def open_channel(self, argv: Sequence[str]) -> Channel: ...

    @abc.abstractmethod
    async def put_file(self, local_path: str, remote_path: str) -> None: ...

    @abc.abstractmethod
    async def get_file(self, remote_path: str, local_path: str) -> None: ...

    async def probe(self, timeout_s: float) -> None:
        """Raise :class:`~flowmesh_sdk.errors.ProviderUnavailableError` unless the machine
        answers a trivial command within ``timeout_s`` (a pool's heartbeat, and its check
        of an instance after an error under a task)."""
        try:
            async with timers.timeout(timeout_s):   # no task of its own, unlike wait_for
                res = await self.run(["true"], timeout_s=timeout_s)
        except TimeoutError as exc:
            raise ProviderUnavailableError(f"{self.label}: `true` got no answer within {timeout_s:g} s") from exc
        if not res.ok:
            raise ProviderUnavailableError(f"{self.label}: `true` failed: {res.describe()}")

    async def wait_reachable(self, timeout_s: float) -> None:
        """Return once a trivial command runs on the machine; raise
        :class:`~flowmesh_sdk.errors.ProviderUnavailableError` past ``timeout_s``."""
        await Runner.probe(self, timeout_s)   # the plain one: a runner's own probe may differ

    async def close(self) -> None:  # noqa: B027 - optional for runners without state
        return None
