"""The first channel of a container started attached (:meth:`ContainerRuntime.start
<flowmesh_sdk.remote.runtime.ContainerRuntime.start>`): the runtime client's own stdin and
stdout, joined to the shell that the container's PID 1 started on the container's stdio.

The client's stream ends only with the container, not with that shell, so PID 1 writes a
line once the shell has ended (``ATTACHED_GONE``, after a newline that ends whatever the
shell left unfinished): :meth:`AttachedChannel.readline` returns the end of the stream
there (b"") and the channel is no longer alive, as a channel whose process exited.
Closing the channel kills the client at once (waiting would be for the container's end);
the container runs on until it is removed, and the shell sees its stdin end."""

from __future__ import annotations

from ..errors import SandboxClosedError
from .runner import Channel
from .runtime_config import ATTACHED_GONE


class AttachedChannel(Channel):
    """``inner``: the channel of ``podman run -i`` (see the module docstring)."""

    def __init__(self, inner: Channel) -> None:
        self._inner = inner
        self._gone = False

    async def write(self, data: bytes) -> None:
        if self._gone:
            raise SandboxClosedError(f"channel closed: {self.stderr_tail()}")
        await self._inner.write(data)

    async def readline(self) -> bytes:
        if self._gone:
            return b""
        line = await self._inner.readline()
        if line == ATTACHED_GONE:
            self._gone = True
            return b""
        return line

    async def readexactly(self, n: int) -> bytes:
        if self._gone:
            raise SandboxClosedError(f"channel closed mid-read: {self.stderr_tail()}")
        return await self._inner.readexactly(n)

    async def read(self, n: int) -> bytes:
        return b"" if self._gone else await self._inner.read(n)

    @property
    def alive(self) -> bool:
        return not self._gone and self._inner.alive

    def stderr_tail(self) -> str:
        return self._inner.stderr_tail()

    async def last_words(self, wait_s: float = 1.0) -> str:
        return await self._inner.last_words(wait_s)

    async def close(self) -> None:
        await self._inner.kill()

    async def kill(self) -> None:
        await self._inner.kill()

    def abort(self, exc: Exception) -> None:
        self._inner.abort(exc)
