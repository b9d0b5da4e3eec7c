"""A pod's ports on the coordinator: loopback listeners relayed over ``pods/portforward``.

A worker in a pod (a vLLM server, its stand-in) listens on the pod's own network; a
coordinator outside the cluster reaches it the way ``kubectl port-forward`` does, through the
API server.  :class:`PodPorts` gives each pod a loopback address of its own on the coordinator
(``127.64.0.0/10``, one per pod, so every pod's port 8000 is ``<its address>:8000``) and listens
there; each TCP connection accepted is one WebSocket to
``/api/v1/namespaces/NS/pods/NAME/portforward?ports=P`` (subprotocol ``v4.channel.k8s.io``,
the only one the kubelet's port forwarder serves besides the legacy unnamed one), relayed
both ways.  Code that reaches a worker at ``host:port`` (``ServeCommand``'s URL, the
endpoint's HTTP client) runs unchanged on that address: the runner's ``target.host`` is it.

Wire (the kubelet's ``portforward/websocket.go``; the official client's
``kubernetes.stream.ws_client.PortForward`` reads it the same way): one port per stream,
data on channel 0 and errors on channel 1; the first frame of each channel is the port,
two bytes little-endian; then ``[0] + bytes`` both ways, and text on channel 1 when the
forwarder could not connect in the pod (the local connection is then closed).  There is no
half-close: the local side's EOF closes the WebSocket, the WebSocket's end closes the local
connection.  The socket is opened by the client's ``create_websocket`` (its TLS and token
handling, as :mod:`.stream` does); a daemon thread per connection reads frames (the socket
blocks) and writes them on the loop, waiting for each write to drain (back-pressure); writes
towards the pod go out on the provider's worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import random
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from flowmesh_sdk.errors import ProviderError, ProviderUnavailableError

from .errors import PROVIDER

log = logging.getLogger("flowmesh.providers.k8s.portforward")

V4 = "v4.channel.k8s.io"
DATA, ERROR = 0, 1
_NET = ipaddress.ip_network("127.64.0.0/10")
_next = random.randrange(_NET.num_addresses)   # this process's next pod address (offset in _NET)
_lock = threading.Lock()
_TRIES = 64


def _addresses() -> str:
    """The next loopback address for a pod (never ``.0`` or ``.255``)."""
    global _next
    with _lock:
        while True:
            addr = _NET.network_address + (_next % _NET.num_addresses)
            _next += 1
            if int(addr) & 0xFF not in (0, 255):
                return str(addr)


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One forwarded port: ``host:port`` on the coordinator reaches ``remote_port`` of ``pod``."""

    pod: str
    host: str
    port: int
    remote_port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class PodPorts:
    """The listeners of one pod's forwarded ports (see the module docstring).  ``host`` is
    the pod's loopback address once a port was forwarded (None before)."""

    def __init__(self, *, label: str, path: str, configuration: Any,
                 send: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        self.label = label              # k8s:<context>/<namespace>/<pod>
        self._path = path               # /api/v1/namespaces/NS/pods/NAME
        self._cfg = configuration
        self._send = send               # runs a blocking callable on the provider's worker threads
        self.host: str | None = None
        self.forwarded: dict[int, Forwarded] = {}     # remote port -> its listener
        self._servers: list[asyncio.Server] = []
        self._conns: set[_Relay] = set()
        self._closed = False
        self.streams = 0                 # port-forward WebSockets opened (one per local connection)

    def __repr__(self) -> str:
        return f"PodPorts({self.label}, host={self.host}, ports={sorted(self.forwarded)})"

    # ---- listeners ---------------------------------------------------------------------
    def _bind(self, host: str, port: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    async def open(self, ports: Sequence[int]) -> list[Forwarded]:
        """Forward ``ports`` of the pod, each on the pod's address at the same port number:
        the first call picks an address where all of them are free."""
        if self._closed:
            raise ProviderError(f"{self.label}: its port forwards are closed", provider=PROVIDER, code="Closed")
        want = [p for p in dict.fromkeys(ports) if p not in self.forwarded]
        if not want:
            return [self.forwarded[p] for p in ports]
        hosts = [self.host] if self.host is not None else [_addresses() for _ in range(_TRIES)]
        last: OSError | None = None
        for host in hosts:
            socks: list[socket.socket] = []
            try:
                for port in want:
                    socks.append(self._bind(host, port))
            except OSError as exc:
                for s in socks:
                    s.close()
                last = exc
                if exc.errno not in (errno.EADDRINUSE, errno.EACCES):
                    break
                continue
            self.host = host
            for port, sock in zip(want, socks):
                server = await asyncio.start_server(self._handler(port), sock=sock)
                self._servers.append(server)
                self.forwarded[port] = Forwarded(self.label.rsplit("/", 1)[-1], host, port, port)
            return [self.forwarded[p] for p in ports]
        raise ProviderUnavailableError(
            f"{self.label}: no loopback address to forward port(s) {', '.join(map(str, want))} on "
            f"({_NET} on this machine; tried {', '.join(hosts[:3])}...): {last}", provider=PROVIDER,
            code="PortForwardBind") from last

    async def open_one(self, remote_port: int, local_port: int | None = None) -> Forwarded:
        """Forward ``remote_port``: on the same port of the pod's address (``local_port``
        None), or on ``local_port`` there (0: any free one)."""
        if remote_port in self.forwarded:
            return self.forwarded[remote_port]
        if local_port is None or local_port == remote_port:
            return (await self.open([remote_port]))[0]
        if self._closed:
            raise ProviderError(f"{self.label}: its port forwards are closed", provider=PROVIDER, code="Closed")
        if self.host is None:
            self.host = _addresses()
        try:
            sock = self._bind(self.host, local_port)
        except OSError as exc:
            raise ProviderUnavailableError(f"{self.label}: cannot listen on {self.host}:{local_port}: {exc}",
                                           provider=PROVIDER, code="PortForwardBind") from exc
        server = await asyncio.start_server(self._handler(remote_port), sock=sock)
        self._servers.append(server)
        fwd = Forwarded(self.label.rsplit("/", 1)[-1], self.host, sock.getsockname()[1], remote_port)
        self.forwarded[remote_port] = fwd
        return fwd

    # ---- connections -------------------------------------------------------------------
    def _handler(self, port: int) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._accept(reader, writer, port)
        return handle

    def _url(self, port: int) -> str:
        host = self._cfg.host.rstrip("/")
        scheme = "wss" if host.startswith("https://") else "ws"
        return f"{scheme}://{host.split('://', 1)[1]}{self._path}/portforward?{urlencode({'ports': port})}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        from kubernetes.stream.ws_client import create_websocket   # the k8s extra

        headers = {"sec-websocket-protocol": V4}
        token = self._cfg.get_api_key_with_prefix("authorization") or self._cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["authorization"] = token
        url = self._url(port)
        self.streams += 1
        try:
            ws = await self._send(lambda: create_websocket(self._cfg, url, headers))
        except Exception as exc:  # noqa: BLE001 - refused (the pod is not running, gone): the connection ends
            log.warning("%s: port-forward of %d refused: %s", self.label, port, exc)
            writer.close()
            return
        relay = _Relay(ws, reader, writer, port, self._send, self.label)
        self._conns.add(relay)
        try:
            await relay.run()
        finally:
            self._conns.discard(relay)

    async def close(self) -> None:
        """Stop listening and end every relayed connection."""
        self._closed = True
        for server in self._servers:
            server.close()
        for relay in list(self._conns):
            await relay.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)
        self._servers.clear()


class _Relay:
    """One local connection relayed over one port-forward WebSocket."""

    def __init__(self, ws: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int,
                 send: Callable[[Callable[[], Any]], Awaitable[Any]], label: str) -> None:
        self._ws, self._reader, self._writer, self._port = ws, reader, writer, port
        self._send, self._label = send, label
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        self.error: str | None = None

    async def run(self) -> None:
        threading.Thread(target=self._from_pod, name="flowmesh-k8s-portforward", daemon=True).start()
        upstream = asyncio.ensure_future(self._to_pod())
        try:
            await asyncio.wait({upstream, asyncio.ensure_future(self._done.wait())},
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            await self.close()

    async def _to_pod(self) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await self._reader.read(1 << 16):
                frame = bytes([DATA]) + data
                await self._send(functools.partial(self._ws.send_binary, frame))

    def _from_pod(self) -> None:
        """The reader thread: frames from the pod to the local connection."""
        seen = [False, False]
        try:
            while True:
                opcode, data = self._ws.recv_data(control_frame=False)
                if opcode == 8:   # OPCODE_CLOSE
                    break
                if not data:
                    continue
                channel, payload = data[0], bytes(data[1:])
                if channel > ERROR:
                    raise ValueError(f"unexpected channel {channel}")
                if not seen[channel]:   # the port, two bytes little-endian
                    seen[channel] = True
                    if len(payload) != 2 or int.from_bytes(payload, "little") != self._port:
                        raise ValueError(f"unexpected initial frame on channel {channel}: {payload!r}")
                    continue
                if channel == ERROR:
                    self.error = (self.error or "") + payload.decode(errors="replace")
                    log.warning("%s: port-forward of %d: %s", self._label, self._port, self.error)
                    break
                asyncio.run_coroutine_threadsafe(self._write(payload), self._loop).result()
        except Exception as exc:  # noqa: BLE001 - a dropped socket (or a protocol error) ends the connection
            if not self._done.is_set():
                log.debug("%s: port-forward of %d ended: %s", self._label, self._port, exc)
        finally:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._done.set)

    async def _write(self, data: bytes) -> None:
        if self._writer.is_closing():
            return
        with contextlib.suppress(ConnectionError, OSError):
            self._writer.write(data)
            await self._writer.drain()

    async def close(self) -> None:
        self._done.set()
        ws = self._ws
        with contextlib.suppress(Exception):
            await self._send(ws.close)
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()


__all__ = ["Forwarded", "PodPorts"]
