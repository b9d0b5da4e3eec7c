"""Commands in a pod over the Kubernetes exec stream, held open.

``GET /api/v1/namespaces/NS/pods/NAME/exec?command=...&stdin=true&stdout=true&stderr=true``
upgraded to a WebSocket whose subprotocol is ``v5.channel.k8s.io`` (or ``v4``): each binary
message starts with its channel -- 0 stdin, 1 stdout, 2 stderr, 3 the exec's final
``v1 Status``; ``v5`` adds 255, ``[255, n]`` closing stream ``n`` (so stdin can be closed
while the output is still read).  Source: the KEP "Transition from SPDY to WebSockets"
(kubernetes/enhancements, KEP-4006) and the official client's ``kubernetes.stream.ws_client``,
whose ``create_websocket`` opens the socket here (its TLS and bearer-token handling); the
``stream()`` helper is not used because it patches ``ApiClient.call_api`` while it runs,
which races with other calls on the same client.

:class:`ExecChannel` is one such stream as a :class:`~flowmesh_sdk.remote.runner.Channel`:
a daemon thread reads frames (the socket blocks) and feeds an asyncio stream on the loop;
writes go out on the provider's worker threads.  A sandbox opens ONE of these for its agent
shell and runs every command over it (:class:`~flowmesh_sdk.sandbox.Sandbox`): the round
trip is the SDK's, not one API exec per command.  :class:`PodRunner` runs one-off commands
(a probe, a file copy) as one exec each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from flowmesh_sdk import clock, timers
from flowmesh_sdk.errors import FlowMeshError, InstanceLost, ProviderUnavailableError, SandboxClosedError
from flowmesh_sdk.remote.runner import Channel, CommandResult, Runner, StreamChannel

from .pods import CONTAINER
from .portforward import PodPorts

STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
V5 = "v5.channel.k8s.io"

# how long a stream cut without an exit status waits for the watch's word on its pod: the kubelet
# reports an eviction only once the container is stopped, seconds after the stream died (stress
# run c16 saw more than 5 s on a busy 2-core machine)
CUT_VERDICT_S = 30.0
KILLED = 137   # a held-open shell's exit code when its container is stopped (SIGKILL)


def exit_code(status: dict[str, Any] | None) -> int:
    """The exit code a channel-3 Status carries (0 for Success; -1 when the stream ended
    without one: cut, so the command's fate is unknown)."""
    if status is None:
        return -1
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or ():
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    return 1


def _subprotocol(sock: Any) -> str:
    """The subprotocol the server chose.  websocket-client records it only when the caller
    names the subprotocols itself; the official client's ``create_websocket`` offers them in a
    raw header, so the answer is in the response's ``Sec-WebSocket-Protocol`` header."""
    chosen = getattr(sock, "subprotocol", None)
    if chosen:
        return str(chosen)
    headers = sock.getheaders() if hasattr(sock, "getheaders") else None
    return next((str(v).strip() for k, v in (headers or {}).items() if k.lower() == "sec-websocket-protocol"), "")


class ExecChannel(StreamChannel):
    """One exec stream into a pod (see the module docstring): the reader thread feeds the
    frames of channels 1 and 2 to the two asyncio streams a :class:`StreamChannel` reads."""

    def __init__(self, sock: Any, loop: asyncio.AbstractEventLoop,
                 send: Callable[[Callable[[], Any]], Awaitable[Any]],
                 on_close: Callable[[ExecChannel], None] | None = None,
                 why_cut: Callable[[], Awaitable[Exception | None]] | None = None,
                 why_killed: Callable[[], Awaitable[Exception | None]] | None = None) -> None:
        self._stderr_in = asyncio.StreamReader()
        super().__init__(asyncio.StreamReader(limit=1 << 24), self._stderr_in)
        self._sock = sock
        self._on_close = on_close
        self._why_cut = why_cut
        self._why_killed = why_killed
        self._closing = False
        self._loop = loop
        self._send = send
        self._v5 = _subprotocol(sock) == V5
        self.status: dict[str, Any] | None = None
        self._ended = asyncio.Event()
        self._alive = True
        threading.Thread(target=self._read, name="flowmesh-k8s-exec", daemon=True).start()

    # ---- the reader thread -----------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                opcode, data = self._sock.recv_data(control_frame=False)
                if opcode == 8 or not data:   # OPCODE_CLOSE
                    if opcode == 8:
                        break
                    continue
                channel, payload = data[0], bytes(data[1:])
                if channel == STDOUT and payload:
                    self._call(self._stdout.feed_data, payload)
                elif channel == STDERR and payload:
                    self._call(self._stderr_in.feed_data, payload)
                elif channel == STATUS and payload:
                    with contextlib.suppress(ValueError):
                        self.status = json.loads(payload)
        except Exception:  # noqa: BLE001 - a dropped socket ends the stream
            pass
        finally:
            self._call(self._on_end)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _on_end(self) -> None:
        self._alive = False
        self._stderr_in.feed_eof()
        why = None
        if not self._closing:
            if self.status is None:
                # cut without an exit status: the pod may have been evicted or lost -- the
                # watch says which before the reader sees the end (then it reads
                # InstanceLost, not EOF)
                why = self._why_cut
            elif exit_code(self.status) == KILLED:
                # a held-open shell killed: its container stopped (an eviction's, whose exec
                # stream can end before the watch reports the pod) or something in it killed
                # the shell -- the runner tells which
                why = self._why_killed
        if why is not None:
            asyncio.ensure_future(self._end_cut(why))
            return
        self._finish(None)

    async def _end_cut(self, why: Callable[[], Awaitable[Exception | None]]) -> None:
        try:
            exc = await why()
        except Exception as err:  # noqa: BLE001 - no verdict: a plain end
            exc = None if isinstance(err, (asyncio.TimeoutError, TimeoutError)) else err
        self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        if self._stdout.exception() is None:
            if exc is not None:
                self._stdout.set_exception(exc)
            else:
                self._stdout.feed_eof()
        self._ended.set()

    # ---- Channel ---------------------------------------------------------------------
    async def write(self, data: bytes) -> None:
        if not self._alive:
            raise SandboxClosedError(f"exec stream closed: {self.stderr_tail()}")
        frame = bytes([STDIN]) + data
        try:
            await self._send(lambda: self._sock.send_binary(frame))
        except Exception as exc:  # noqa: BLE001 - the socket's errors are the channel's
            raise SandboxClosedError(f"exec stream closed: {type(exc).__name__}") from exc

    async def close_stdin(self) -> None:
        """End the process's stdin (v5; under v4 there is no way but closing the stream)."""
        if self._v5 and self._alive:
            with contextlib.suppress(Exception):
                await self._send(lambda: self._sock.send_binary(bytes([CLOSE, STDIN])))

    @property
    def alive(self) -> bool:
        return self._alive

    async def ended(self, timeout_s: float) -> bool:
        with contextlib.suppress(asyncio.TimeoutError):
            async with timers.timeout(timeout_s):
                await self._ended.wait()
        return self._ended.is_set()

    def stderr_bytes(self) -> bytes:
        return "\n".join(self._err).encode()

    async def close(self) -> None:
        self._closing = True
        sock = self._sock
        with contextlib.suppress(Exception):
            await self._send(sock.close)
        self._alive = False
        if self._on_close is not None:
            self._on_close(self)

    def abort(self, exc: Exception) -> None:
        self._alive = False
        super().abort(exc)


class PodRunner(Runner):
    """Runs commands in one pod's sandbox container through exec streams."""

    needs_heartbeat = False   # the namespace's watch reports a pod's loss; nothing to probe

    def __init__(self, *, label: str, path: str, configuration: Any, loop_send: Callable[..., Awaitable[Any]],
                 ready: Callable[[float], Awaitable[None]],
                 why_cut: Callable[[], Awaitable[Exception | None]] | None = None,
                 target: PodPorts | None = None) -> None:
        """``ready(timeout)`` returns once the pod runs; ``why_cut()`` says why a stream ended
        without an exit status (the pod's loss as ``InstanceLost``, or None); ``target``: the
        pod's forwarded ports (:mod:`.portforward`), whose ``host`` is where the coordinator
        reaches them (what ``ServeCommand`` reads as the runner's ``target.host``)."""
        self.label = label
        self.target = target
        self._why_cut = why_cut
        self._path = path                 # /api/v1/namespaces/NS/pods/NAME
        self._cfg = configuration
        self._send = loop_send            # runs a blocking callable on the provider's worker threads
        self._ready = ready
        self._channels: set[ExecChannel] = set()
        self._lost: Exception | None = None
        self.execs = 0

    def _url(self, argv: Sequence[str], tty: bool = False) -> str:
        query = [("command", a) for a in argv] + [("container", CONTAINER), ("stdin", "true"), ("stdout", "true"),
                                                   ("stderr", "true"), ("tty", "true" if tty else "false")]
        host = self._cfg.host.rstrip("/")
        scheme = "wss" if host.startswith("https://") else "ws"
        return f"{scheme}://{host.split('://', 1)[1]}{self._path}/exec?{urlencode(query)}"

    async def _open(self, argv: Sequence[str], *, held: bool = False) -> ExecChannel:
        from kubernetes.stream.ws_client import create_websocket   # the k8s extra

        if self._lost is not None:
            raise self._lost
        headers = {}
        token = self._cfg.get_api_key_with_prefix("authorization") or self._cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["authorization"] = token
        url = self._url(argv)
        self.execs += 1
        try:
            sock = await self._send(lambda: create_websocket(self._cfg, url, headers))
        except Exception as exc:  # noqa: BLE001 - a refused upgrade is the pod's state or the server's
            raise ProviderUnavailableError(f"{self.label}: exec refused: {exc}", provider="k8s",
                                           code="ExecFailed") from exc
        chan = ExecChannel(sock, asyncio.get_running_loop(), self._send, on_close=self._channels.discard,
                           why_cut=self._why_cut, why_killed=self._why_killed if held else None)
        self._channels.add(chan)
        return chan

    def lost(self, exc: Exception) -> None:
        """The pod failed or went away: every stream into it ends with ``exc`` now."""
        self._lost = exc
        for chan in list(self._channels):
            chan.abort(exc)

    async def wait_reachable(self, timeout_s: float) -> None:
        await self._ready(timeout_s)

    async def probe(self, timeout_s: float) -> None:
        """:meth:`Runner.probe`; when ``true`` does not run, the watch's word on the pod within
        what is left of ``timeout_s``: its loss (``InstanceLost`` naming the kubelet's reason:
        evicted, preempted, node lost) rather than a bare refusal.  The kubelet stops the
        container before it reports the pod failed: a probe can come between the two."""
        deadline = clock.monotonic() + timeout_s
        try:
            await super().probe(timeout_s)
        except ProviderUnavailableError as exc:
            if self._lost is not None:
                raise self._lost from exc
            verdict = None
            if self._why_cut is not None:
                try:
                    async with timers.timeout(max(0.0, deadline - clock.monotonic())):
                        verdict = await self._why_cut()
                except (TimeoutError, FlowMeshError):
                    pass   # no word from the watch: the refusal stands, its cause kept
            if verdict is None:
                raise
            raise verdict from exc

    async def open_channel(self, argv: Sequence[str]) -> Channel:
        return await self._open(argv, held=True)

    async def _why_killed(self) -> Exception | None:
        """A held-open channel's shell was killed unasked: the pod's loss if the pod no longer
        runs commands (the probe, refused, waits for the watch's word), else None (something
        in the sandbox killed it, and the channel ends as it would have).  A one-off command's
        137 is its own exit code, never asked about."""
        try:
            await self.probe(CUT_VERDICT_S)
        except InstanceLost as exc:
            return exc
        except FlowMeshError:
            return None   # no verdict: the plain end
        return None

    async def run(self, argv: Sequence[str], *, timeout_s: float, input: bytes | None = None) -> CommandResult:
        t0 = time.monotonic()
        chan = await self._open(argv)
        out = bytearray()
        timed_out = False
        try:
            if input:
                await chan.write(input)
            await chan.close_stdin()

            async def drain() -> None:
                while chunk := await chan.read(1 << 16):
                    out.extend(chunk)

            try:
                async with timers.timeout(timeout_s):
                    await drain()
                    await chan.ended(timeout_s)
            except asyncio.TimeoutError:
                timed_out = True
        finally:
            await chan.close()
        await chan.last_words(1.0)   # stderr read to its end
        err = chan.stderr_bytes()
        code = -1 if timed_out else exit_code(chan.status)
        return CommandResult(tuple(argv), code, bytes(out), err, time.monotonic() - t0, timed_out)

    async def put_file(self, local_path: str, remote_path: str) -> None:
        data = await asyncio.to_thread(Path(local_path).read_bytes)
        res = await self.run(["sh", "-c", f"cat > {shlex.quote(remote_path)}"], timeout_s=300, input=data)
        if not res.ok:
            raise ProviderUnavailableError(f"{self.label}: could not write {remote_path}: {res.describe()}",
                                           provider="k8s", code="CopyFailed")

    async def get_file(self, remote_path: str, local_path: str) -> None:
        res = await self.run(["cat", remote_path], timeout_s=300)
        if not res.ok:
            raise ProviderUnavailableError(f"{self.label}: could not read {remote_path}: {res.describe()}",
                                           provider="k8s", code="CopyFailed")
        await asyncio.to_thread(Path(local_path).write_bytes, res.stdout)

    async def close(self) -> None:
        for chan in list(self._channels):
            await chan.close()
        if self.target is not None:
            await self.target.close()
