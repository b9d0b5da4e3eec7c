"""``pods/portforward`` as kubectl's ``port-forward`` speaks it: SPDY/3.1 (:mod:`.spdy`) tunnelled in a
WebSocket whose subprotocol is ``SPDY/3.1+portforward.k8s.io`` (KEP-4006; kubectl 1.31+ asks for it
first, client-go's ``tools/portforward/tunneling_connection.go``): the SPDY byte stream is the
concatenation of the binary messages' payloads, each way.  Served as the kubelet's streaming server
serves SPDY port-forward (``pkg/kubelet/cri/streaming/portforward/httpstream.go``), each forwarded
connection a TCP connection to ``localhost:PORT`` inside the pod's network namespace.

The client opens streams (SYN_STREAM) with the headers ``streamtype`` (``error`` or ``data``), ``port``
(1-65535) and ``requestid``; each is answered with a SYN_REPLY with no headers, or, with a missing or bad
``port``/``streamtype``, a RST_STREAM (CANCEL) as the kubelet rejects it.  The data and error streams of
one ``requestid`` are a pair (a client that sends no ``requestid``: the error stream's id, or the data
stream's id minus 2, as the kubelet guesses); a second stream of a type the pair has gets ``error
processing stream for request R: data stream already assigned`` on the pair's error stream.  Once the
pair is complete the connection to the pod's port is made: the client's DATA on the data stream goes to
it, the pod's bytes come back as DATA frames on the data stream (one frame per read).  The client's FIN
on the data stream half-closes the connection to the pod, which is closed a second later if the pod has
not closed it (containerd's forwarder waits that long for the other direction); when the pod's end
closes, the data and error streams get FIN.  A port nothing listens on gets the forwarder's error text
on the error stream (as the v4 WebSocket port-forward words it, :mod:`.portforward`), then both streams
get FIN.  A pair not complete within 30 s (the kubelet's stream creation timeout) gets ``(conn=C,
request=R) timed out waiting for streams`` on its error stream.  The client's RST_STREAM on a stream of
a pair drops the pair and its connection.

Session frames: PING with an odd id (the client's) is echoed; SETTINGS and WINDOW_UPDATE are read and
ignored -- spdystream, on both ends of kubectl's sessions, keeps no flow-control windows, so neither does
this server; GOAWAY refuses new streams (RST_STREAM REFUSED_STREAM) and ends the session when the
pairs still open have ended.  A frame that cannot be parsed ends the session with a GOAWAY
(PROTOCOL_ERROR).  When the WebSocket closes, the connections to the pod are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import WSMsgType, web

from .portforward import SPDY_TUNNEL
from .spdy import (CANCEL, FLAG_FIN, PROTOCOL_ERROR, REFUSED_STREAM, Data, Frame, FrameReader, FrameWriter, GoAway,
                   Headers, Ping, RstStream, SynReply, SynStream)

__all__ = ["SPDY_TUNNEL", "serve_spdy_portforward"]

STREAM_CREATION_TIMEOUT_S = 30.0   # the kubelet's streaming server default (DefaultStreamCreationTimeout)
_HALF_CLOSED_GRACE_S = 1.0
_READ = 1 << 16


@dataclass(eq=False)
class _Pair:
    request_id: str
    data_id: int | None = None
    error_id: int | None = None
    port: int = 0
    to_pod: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    client_done: bool = False
    finished: bool = False
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None


def _stream_headers(frame: SynStream) -> tuple[str, int]:
    """(streamtype, port) of a port-forward stream; ValueError with the kubelet's words."""
    headers = {k: v[0] if v else "" for k, v in frame.headers.items()}
    text = headers.get("port", "")
    if not text:
        raise ValueError('"port" header is required')
    if not text.isdigit() or int(text) > 65535:
        raise ValueError(f"unable to parse {text!r} as a port")
    if int(text) < 1:
        raise ValueError(f'port "{text}" must be > 0')
    kind = headers.get("streamtype", "")
    if not kind:
        raise ValueError('"streamType" header is required')
    if kind not in ("error", "data"):
        raise ValueError(f'invalid stream type "{kind}"')
    return kind, int(text)


class _Session:
    def __init__(self, ws: web.WebSocketResponse, connect: Callable[[int], Awaitable[socket.socket]],
                 error_prefix: Callable[[int], str], stream_timeout_s: float) -> None:
        self.ws = ws
        self.connect = connect
        self.error_prefix = error_prefix
        self.stream_timeout_s = stream_timeout_s
        self.writer = FrameWriter()
        self.reader = FrameReader()
        self.lock = asyncio.Lock()
        self.pairs: dict[str, _Pair] = {}
        self.streams: dict[int, _Pair] = {}
        self.last_stream = 0
        self.going_away = False
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tasks: set[asyncio.Task[None]] = set()

    async def send(self, *frames: Frame) -> None:
        # encoded under the lock: header blocks must reach the wire in the order they were compressed
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            async with self.lock:
                for frame in frames:
                    await self.ws.send_bytes(self.writer.encode(frame))

    def spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def end(self) -> None:
        if not self.ended.done():
            self.ended.set_result(None)

    async def from_client(self) -> None:
        async for msg in self.ws:
            if msg.type != WSMsgType.BINARY:
                continue   # the tunnel carries SPDY in binary messages only
            try:
                frames = self.reader.feed(msg.data)
            except ValueError:
                await self.send(GoAway(self.last_stream, PROTOCOL_ERROR))
                return
            for frame in frames:
                await self.handle(frame)

    async def handle(self, frame: Frame) -> None:
        if isinstance(frame, SynStream):
            await self.open_stream(frame)
        elif isinstance(frame, Data | Headers):
            pair = self.streams.get(frame.stream_id)
            if isinstance(frame, Data) and frame.data and pair is not None and frame.stream_id == pair.data_id \
                    and not pair.client_done:
                pair.to_pod.put_nowait(frame.data)
            if frame.flags & FLAG_FIN and pair is not None:
                self.client_fin(pair, frame.stream_id)
        elif isinstance(frame, RstStream):
            if (pair := self.streams.get(frame.stream_id)) is not None:
                self.drop(pair)
        elif isinstance(frame, Ping):
            if frame.ping_id % 2:   # the client's; an even id would answer a ping of this server's (none sent)
                await self.send(frame)
        elif isinstance(frame, GoAway):
            self.going_away = True
            if not self.pairs:
                self.end()
        # Settings, WindowUpdate, SynReply (this server opens no streams): nothing to do

    async def open_stream(self, frame: SynStream) -> None:
        sid = frame.stream_id
        self.last_stream = max(self.last_stream, sid)
        if self.going_away:
            await self.send(RstStream(sid, REFUSED_STREAM))
            return
        try:
            kind, port = _stream_headers(frame)
        except ValueError:
            await self.send(RstStream(sid, CANCEL))   # the kubelet's handler rejects it: stream.Reset()
            return
        request_id = (frame.headers.get("requestid") or [""])[0] or str(sid if kind == "error" else sid - 2)
        pair = self.pairs.get(request_id)
        if pair is None:
            pair = self.pairs[request_id] = _Pair(request_id)
            pair.timer = asyncio.get_running_loop().call_later(self.stream_timeout_s, self.expire, pair)
        self.streams[sid] = pair
        await self.send(SynReply(sid))
        if (pair.data_id if kind == "data" else pair.error_id) is not None:
            await self.print_error(pair, f"error processing stream for request {request_id}: {kind} stream already "
                                         "assigned")
        elif kind == "data":
            pair.data_id, pair.port = sid, port
        else:
            pair.error_id = sid
        if frame.flags & FLAG_FIN:
            self.client_fin(pair, sid)
        if pair.task is None and pair.data_id is not None and pair.error_id is not None:
            if pair.timer is not None:
                pair.timer.cancel()
            pair.task = self.spawn(self.forward(pair))

    def client_fin(self, pair: _Pair, sid: int) -> None:
        if sid == pair.data_id and not pair.client_done:
            pair.client_done = True
            pair.to_pod.put_nowait(None)

    async def print_error(self, pair: _Pair, text: str) -> None:
        if pair.error_id is not None and not pair.finished:
            await self.send(Data(pair.error_id, text.encode()))

    def expire(self, pair: _Pair) -> None:
        if pair.task is None and not pair.finished:
            async def timed_out() -> None:
                await self.print_error(pair, f"(conn={id(self):#x}, request={pair.request_id}) timed out waiting "
                                             "for streams")
                await self.finish(pair)
            self.spawn(timed_out())

    async def forward(self, pair: _Pair) -> None:
        assert pair.data_id is not None
        try:
            sock = await self.connect(pair.port)
        except OSError as exc:
            await self.print_error(pair, f"{self.error_prefix(pair.port)}: {exc}")
            await self.finish(pair)
            return
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=_READ)
        to_pod = self.spawn(self.to_pod(pair, writer))
        try:
            while data := await reader.read(_READ):
                await self.send(Data(pair.data_id, data))
        except (ConnectionError, OSError):
            pass
        finally:
            to_pod.cancel()
            writer.close()
        await self.finish(pair)

    async def to_pod(self, pair: _Pair, writer: asyncio.StreamWriter) -> None:
        try:
            while (chunk := await pair.to_pod.get()) is not None:
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass
        await asyncio.sleep(_HALF_CLOSED_GRACE_S)
        writer.close()

    async def finish(self, pair: _Pair) -> None:
        """FIN on the pair's streams (the error stream first, as the kubelet's deferred closes go)."""
        if pair.finished:
            return
        await self.send(*(Data(sid, b"", FLAG_FIN) for sid in (pair.error_id, pair.data_id) if sid is not None))
        self.forget(pair)

    def drop(self, pair: _Pair) -> None:
        self.forget(pair)
        if pair.task is not None and pair.task is not asyncio.current_task():
            pair.task.cancel()

    def forget(self, pair: _Pair) -> None:
        pair.finished = True
        if pair.timer is not None:
            pair.timer.cancel()
        if self.pairs.get(pair.request_id) is pair:
            del self.pairs[pair.request_id]
        for sid in (pair.data_id, pair.error_id):
            if sid is not None and self.streams.get(sid) is pair:
                del self.streams[sid]
        if self.going_away and not self.pairs:
            self.end()


async def serve_spdy_portforward(request: web.Request, *, connect: Callable[[int], Awaitable[socket.socket]],
                                 error_prefix: Callable[[int], str],
                                 stream_timeout_s: float = STREAM_CREATION_TIMEOUT_S) -> web.WebSocketResponse:
    """Upgrade ``request`` to the SPDY tunnel and serve port-forward streams until it closes (see the module
    docstring).  ``connect(port)`` makes the connection in the pod; ``error_prefix(port)`` heads its error."""
    ws = web.WebSocketResponse(protocols=(SPDY_TUNNEL,), compress=False, timeout=5.0, max_msg_size=16 << 20)
    await ws.prepare(request)
    session = _Session(ws, connect, error_prefix, stream_timeout_s)
    client = asyncio.ensure_future(session.from_client())
    try:
        await asyncio.wait({client, session.ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        client.cancel()
        for pair in list(session.pairs.values()):
            session.forget(pair)
        tasks = [client, *session.tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()
    return ws
