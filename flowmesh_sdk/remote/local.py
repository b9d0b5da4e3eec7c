"""The local runner: commands as subprocesses of this process, on this host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Sequence

from .. import timers
from ..errors import SandboxClosedError
from .children import pidfd_watcher
from .runner import Channel, CommandResult, Runner, StreamChannel


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_CLOSE_GRACE_S = 2.0   # a closed channel's process gets this long to exit on its own


class LocalChannel(StreamChannel):
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        super().__init__(proc.stdout, proc.stderr)
        self._proc = proc

    async def write(self, data: bytes) -> None:
        if not self.alive:
            raise SandboxClosedError(f"channel process exited: {self.stderr_tail()}")
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise SandboxClosedError(f"channel closed: {self.stderr_tail()}") from exc

    @property
    def alive(self) -> bool:
        return self._proc.returncode is None

    async def close(self) -> None:
        await self._end(_CLOSE_GRACE_S)

    async def kill(self) -> None:
        await self._end(0.0)

    async def _end(self, grace_s: float) -> None:
        """Close stdin; kill the process's group unless it exits within ``grace_s``."""
        if self._proc.returncode is None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            if grace_s > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._proc.wait(), grace_s)
            if self._proc.returncode is None:
                _kill_group(self._proc)
                await self._proc.wait()
        self._drain.cancel()


class LocalRunner(Runner):
    """Runs commands on this host."""

    label = "local"
    on_this_host = True
    needs_heartbeat = False

    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  input: bytes | None = None) -> CommandResult:
        t0 = time.monotonic()
        pidfd_watcher()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        timed_out = False
        try:
            async with timers.timeout(timeout_s):   # no task of its own, unlike wait_for
                out, err = await proc.communicate(input)
        except TimeoutError:
            timed_out = True
            _kill_group(proc)
            out, err = await proc.communicate()
        except BaseException:
            _kill_group(proc)
            raise
        return CommandResult(tuple(argv), proc.returncode if proc.returncode is not None else -9,
                             out, err, time.monotonic() - t0, timed_out)

    async def open_channel(self, argv: Sequence[str]) -> Channel:
        pidfd_watcher()
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, limit=1 << 20)
        return LocalChannel(proc)

    async def put_file(self, local_path: str, remote_path: str) -> None:
        await asyncio.to_thread(shutil.copyfile, local_path, remote_path)

    async def get_file(self, remote_path: str, local_path: str) -> None:
        await asyncio.to_thread(shutil.copyfile, remote_path, local_path)
