"""``pods/exec`` over WebSocket with Kubernetes' channel protocol, each exec a
``podman exec`` of the pod's container.

The subprotocol is chosen from the client's ``Sec-WebSocket-Protocol`` list by the
emulator's preference: ``v5.channel.k8s.io``, then ``v4.channel.k8s.io``, then
``channel.k8s.io`` (kubectl 1.32 and the Python client ``kubernetes`` 37 offer v5 and v4).
Every message, binary or text (the Python client sends text for ``str`` input), starts
with its channel byte: 0 stdin, 1 stdout, 2 stderr, 3 error (a ``v1 Status`` once the
command ends), 4 resize (``{"Width": W, "Height": H}``); v5 adds 255, close: ``[255, ch]``
closes stream ``ch`` -- for stdin the process's stdin is closed (EOF).  An empty message,
or one with only the channel byte, is ignored.  stdout and stderr go out as they come, one
message per read (nothing waits for a line end).  When the process ends, channel 3 carries
``{"metadata":{},"status":"Success"}`` or, for exit code N, the kubelet's
``{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code:
error executing command [ARGV], exit code N","reason":"NonZeroExitCode","details":
{"causes":[{"reason":"ExitCode","message":"N"}]}}`` (``pkg/kubelet/cri/streaming/
remotecommand/exec.go``; client-go's v4 error decoder and the Python client's
``WSClient.returncode`` read the cause's message as the code), then the socket is closed.
An exit code is podman's: a command the container lacks is 127 (a real kubelet answers that
with an InternalError status instead).

``tty=true`` runs ``podman exec -t`` on a pseudo-terminal (stderr is merged into stdout, as
with a real TTY); a resize message sets its size and signals podman (``SIGWINCH``).  A
client that goes away before the command ends has it killed: the ``podman exec`` process
group, and the processes in the container that carry the exec's mark in their environment
(``FLOWMESH_K8S_EXEC=<id>``, set by the emulator on every exec).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import secrets
import signal
import struct
import subprocess
import termios
import tty
from collections.abc import Callable, Mapping, Sequence

from aiohttp import WSMsgType, web

from .. import hygiene

__all__ = ["CHANNEL_PROTOCOLS", "EXEC_MARK", "exit_status", "negotiate", "serve_exec"]

CHANNEL_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io")
EXEC_MARK = "FLOWMESH_K8S_EXEC"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


def negotiate(request: web.Request) -> str | None:
    """The channel subprotocol to answer with, by the emulator's order of preference."""
    offered = {p.strip() for h in request.headers.getall("Sec-WebSocket-Protocol", []) for p in h.split(",")}
    return next((p for p in CHANNEL_PROTOCOLS if p in offered), None)


def exit_status(argv: Sequence[str], code: int) -> dict[str, object]:
    """What the kubelet writes on the error channel when the command ends."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command "
                       f"[{' '.join(argv)}], exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


class _Pty:
    """The terminal end (master) of a pty, read on the loop."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)   # podman sets it raw too, but only once it runs: no echo before that
        os.set_blocking(self.master, False)
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.master, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:   # EIO: the last slave fd closed
            data = b""
        if not data:
            self._loop.remove_reader(self.master)
        self.queue.put_nowait(data)

    async def write(self, data: bytes) -> None:
        while data:
            try:
                n = os.write(self.master, data)
            except BlockingIOError:
                await asyncio.sleep(0.01)
                continue
            data = data[n:]

    def resize(self, width: int, height: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))

    def close(self) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self.master)
        for fd in (self.master, self.slave):
            with contextlib.suppress(OSError):
                os.close(fd)


async def _kill_exec(proc: asyncio.subprocess.Process, mark: str) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)

    def in_container() -> None:
        procs = hygiene.processes()
        hygiene.kill(hygiene.with_descendants(procs, hygiene.tagged(procs, f"\0{EXEC_MARK}={mark}\0")))
    await asyncio.to_thread(in_container)


async def serve_exec(request: web.Request, protocol: str, *, container: str, argv: Sequence[str],
                     env: Mapping[str, str], stdin: bool, stdout: bool, stderr: bool, tty: bool,
                     track: Callable[[asyncio.subprocess.Process], None] | None = None,
                     untrack: Callable[[asyncio.subprocess.Process], None] | None = None) -> web.WebSocketResponse:
    """Upgrade ``request`` and run ``podman exec`` of ``argv`` in ``container`` until it ends
    or the client goes.  ``track``/``untrack`` are told of the podman process (so that the
    emulator's stop can end it)."""
    ws = web.WebSocketResponse(protocols=(protocol,), compress=False, timeout=5.0, max_msg_size=16 << 20)
    await ws.prepare(request)
    mark = secrets.token_hex(8)
    args = ["exec", "--env", f"{EXEC_MARK}={mark}"]
    if stdin:
        args.append("-i")
    if tty:
        args.append("-t")
    args += [container, *argv]
    pty = _Pty() if tty else None
    if pty is not None:
        proc = await asyncio.create_subprocess_exec("podman", *args, env=dict(env), stdin=pty.slave,
                                                    stdout=pty.slave, stderr=pty.slave, start_new_session=True)
        os.close(pty.slave)
        pty.slave = -1
    else:
        pipe, null = subprocess.PIPE, subprocess.DEVNULL
        proc = await asyncio.create_subprocess_exec("podman", *args, env=dict(env), stdin=pipe if stdin else null,
                                                    stdout=pipe if stdout else null, stderr=pipe if stderr else null,
                                                    start_new_session=True)
    if track is not None:
        track(proc)

    async def send(channel: int, data: bytes) -> None:
        if not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(bytes([channel]) + data)

    async def pump_stream(reader: asyncio.StreamReader | None, channel: int) -> None:
        while reader is not None:
            data = await reader.read(65536)
            if not data:
                return
            await send(channel, data)

    async def pump_pty() -> None:
        assert pty is not None
        while True:
            data = await pty.queue.get()
            if not data:
                return
            await send(STDOUT, data)

    async def close_stdin() -> None:
        if pty is not None:
            await pty.write(b"\x04")
        elif proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()

    async def read_client() -> None:
        async for msg in ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            data = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode()
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == STDIN and payload and stdin:
                try:
                    if pty is not None:
                        await pty.write(payload)
                    elif proc.stdin is not None:
                        proc.stdin.write(payload)
                        await proc.stdin.drain()
                except (BrokenPipeError, ConnectionResetError):
                    pass
            elif channel == RESIZE and payload and pty is not None:
                with contextlib.suppress(ValueError, TypeError, KeyError, OSError):
                    size = json.loads(payload)
                    pty.resize(int(size["Width"]), int(size["Height"]))
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGWINCH)
            elif channel == CLOSE and protocol.startswith("v5.") and payload[:1] == bytes([STDIN]):
                await close_stdin()

    pumps = ([asyncio.ensure_future(pump_pty())] if pty is not None else
             [asyncio.ensure_future(pump_stream(proc.stdout, STDOUT)),
              asyncio.ensure_future(pump_stream(proc.stderr, STDERR))])
    waiter = asyncio.ensure_future(proc.wait())
    reader = asyncio.ensure_future(read_client())
    try:
        await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():   # the client went away: end the command
            await _kill_exec(proc, mark)
            await waiter
            return ws
        _, late = await asyncio.wait(pumps, timeout=5)
        for t in late:
            t.cancel()
        code = proc.returncode or 0
        await send(ERROR, json.dumps(exit_status(argv, code)).encode())
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()
        return ws
    finally:
        for task in pumps:
            task.cancel()
        reader.cancel()
        waiter.cancel()
        if proc.returncode is None:
            await _kill_exec(proc, mark)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
        if pty is not None:
            pty.close()
        if untrack is not None:
            untrack(proc)
