"""``pods/portforward`` over WebSocket, as the kubelet's streaming server serves it
(``pkg/kubelet/cri/streaming/portforward/websocket.go``), each forwarded connection a TCP
connection to ``localhost:PORT`` made inside the pod's network namespace, as containerd's
and CRI-O's port forwarders make it.

``GET /api/v1/namespaces/NS/pods/NAME/portforward?ports=8000[,8001]`` (the apiserver's
``PodPortForwardOptions``: ``ports`` repeated or comma-separated, each 1-65535) upgraded to a
WebSocket.  Subprotocols: ``v4.channel.k8s.io`` (what the official Python client's
``kubernetes.stream.portforward`` gets when it offers ``v5.channel.k8s.io,v4.channel.k8s.io``:
the kubelet's port forwarder knows no v5), none at all (the legacy binary channel protocol),
or ``SPDY/3.1+portforward.k8s.io`` (kubectl's ``port-forward``, 1.31+: SPDY/3.1 tunnelled in
the WebSocket, served by :mod:`.portforward_spdy`; its ports come in stream headers, not in
the query).  ``v4.base64.channel.k8s.io`` is not served, nor a direct ``Upgrade: SPDY/3.1``
(kubectl's fallback, and older kubectls' only way): refused with a 400 before the upgrade.
This module serves the two channel protocols.

Wire: port number ``i`` of the request (in its order) has two channels, data ``2i`` and
error ``2i+1``.  Right after the upgrade each channel gets one frame holding the port as two
bytes, little-endian (``[2i, lo, hi]``, ``[2i+1, lo, hi]``).  Then every binary frame is its
channel byte and payload: the client's frames on ``2i`` go to the pod's port, the pod's
bytes come back on ``2i`` as they are read (one frame per read); the connection to the pod
is made at once for every port.  A port nothing listens on gets the forwarder's error as
text on ``2i+1`` (``error forwarding port P to pod ID, uid : failed to execute portforward
in network namespace "...": failed to connect to localhost:P inside namespace "...", IPv4:
dial tcp4 127.0.0.1:P: connect: connection refused IPv6 dial tcp6 [::1]:P: connect:
connection refused``, containerd's words).  There is no half-close in this protocol: when
the pod's end of every port has ended, the server closes the WebSocket; when the client
closes it, the connections to the pod are closed.

The connection is made from a thread of its own that enters the pod's network namespace
(``setns(2)`` on ``/proc/PID/ns/net`` of the container's init, through libc: Python 3.11 has
no ``os.setns``), connects, and goes back to its own namespace: a socket keeps the namespace
it was made in.  This needs what ``nsenter`` needs (root, as the emulator's podman runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import WSMsgType, web

__all__ = ["PORTFORWARD_PROTOCOLS", "SPDY_TUNNEL", "connect_in_netns", "negotiate_portforward", "parse_ports",
           "serve_portforward"]

V4 = "v4.channel.k8s.io"
SPDY_TUNNEL = "SPDY/3.1+portforward.k8s.io"   # client-go's constants.WebsocketsSPDYTunnelingPortForwardV1
PORTFORWARD_PROTOCOLS = (V4, "", SPDY_TUNNEL)   # "" : no subprotocol, the binary channel protocol
_CLONE_NEWNET = 0x40000000
_READ = 1 << 16


def negotiate_portforward(request: web.Request) -> str | None:
    """The subprotocol to answer with: the first the client offers that is served (as
    apimachinery's ``wsstream`` handshake picks it), ``""`` when it offers none, else None."""
    offered = [p.strip() for h in request.headers.getall("Sec-WebSocket-Protocol", []) for p in h.split(",")
               if p.strip()]
    if not offered:
        return ""
    return next((p for p in offered if p in PORTFORWARD_PROTOCOLS), None)


def parse_ports(values: Sequence[str]) -> list[int]:
    """``ports`` query values as the apiserver converts them (``Convert_Slice_string_To_Slice_int32``:
    repeated or comma-separated); ValueError with the apiserver's or kubelet's words."""
    out: list[int] = []
    for value in values:
        for part in value.split(","):
            try:
                port = int(part)
            except ValueError:
                raise ValueError(f"cannot convert to []int32: strconv.ParseUint: parsing {part!r}: "
                                 "invalid syntax") from None
            if not 0 <= port <= 65535:
                raise ValueError(f"cannot convert to []int32: strconv.ParseUint: parsing {part!r}: "
                                 "value out of range")
            if port < 1:
                raise ValueError(f'port "{value}" must be > 0')
            out.append(port)
    if not out:
        raise ValueError('query parameter "port" is required')
    return out


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _go_error(exc: OSError) -> str:
    return (exc.strerror or str(exc)).lower()


def _connect_here(port: int, timeout_s: float, where: str, ident: str) -> socket.socket:
    errors = []
    for family, host, name in ((socket.AF_INET, "127.0.0.1", "tcp4"), (socket.AF_INET6, "::1", "tcp6")):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        try:
            sock.connect((host, port))
        except OSError as exc:
            sock.close()
            shown = f"[{host}]" if ":" in host else host
            errors.append(f"dial {name} {shown}:{port}: connect: {_go_error(exc)}")
            continue
        sock.settimeout(None)
        return sock
    raise ConnectionRefusedError(f'failed to execute portforward in network namespace "{where}": failed to connect '
                                 f'to localhost:{port} inside namespace "{ident}", IPv4: {errors[0]} '
                                 f"IPv6 {errors[1]} ")


def connect_in_netns(pid: int, port: int, ident: str, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to ``localhost:port`` inside the network namespace of process
    ``pid`` (blocking; run it off the loop).  ``ident`` names the pod in the error."""
    where = f"/proc/{pid}/ns/net"
    box: dict[str, object] = {}

    def run() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(where, os.O_RDONLY)
            try:
                _setns(target)
                try:
                    box["sock"] = _connect_here(port, timeout_s, where, ident)
                finally:
                    _setns(own)   # this thread goes back to the emulator's namespace before it ends
            finally:
                os.close(target)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc
        finally:
            os.close(own)

    t = threading.Thread(target=run, name="k8s-emu-portforward", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]  # box holds the BaseException the thread caught
    sock = box["sock"]
    assert isinstance(sock, socket.socket)
    return sock


async def serve_portforward(request: web.Request, protocol: str, *, ports: Sequence[int],
                            connect: Callable[[int], Awaitable[socket.socket]],
                            error_prefix: Callable[[int], str]) -> web.WebSocketResponse:
    """Upgrade ``request`` and forward ``ports`` over a channel protocol, ``v4.channel.k8s.io`` or
    ``""`` (see the module docstring).  ``connect(port)``
    makes the connection in the pod; ``error_prefix(port)`` heads its error text."""
    ws = web.WebSocketResponse(protocols=(protocol,) if protocol else (), compress=False, timeout=5.0,
                               max_msg_size=16 << 20)
    await ws.prepare(request)
    lock = asyncio.Lock()

    async def send(channel: int, data: bytes) -> None:
        if not ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError):
                async with lock:
                    await ws.send_bytes(bytes([channel]) + data)

    for i, port in enumerate(ports):
        head = port.to_bytes(2, "little")
        await send(2 * i, head)
        await send(2 * i + 1, head)
    writers: list[asyncio.Future[asyncio.StreamWriter | None]] = [
        asyncio.get_running_loop().create_future() for _ in ports]

    async def forward(i: int, port: int) -> None:
        try:
            sock = await connect(port)
        except OSError as exc:
            writers[i].set_result(None)
            await send(2 * i + 1, f"{error_prefix(port)}: {exc}".encode())
            return
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=_READ)
        writers[i].set_result(writer)
        try:
            while data := await reader.read(_READ):
                await send(2 * i, data)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def from_client() -> None:
        async for msg in ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                continue
            data = msg.data if isinstance(msg.data, bytes) else str(msg.data).encode()
            if len(data) < 2 or data[0] % 2 or data[0] // 2 >= len(ports):
                continue   # empty, an error channel (the server's to write) or no such port
            writer = await writers[data[0] // 2]
            if writer is None or writer.is_closing():
                continue
            try:
                writer.write(data[1:])
                await writer.drain()
            except (ConnectionError, OSError):
                pass

    pumps = [asyncio.ensure_future(forward(i, p)) for i, p in enumerate(ports)]

    async def all_ended() -> None:
        await asyncio.gather(*pumps, return_exceptions=True)

    client = asyncio.ensure_future(from_client())
    everything = asyncio.ensure_future(all_ended())
    try:
        await asyncio.wait({client, everything}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (*pumps, client, everything):
            task.cancel()
        await asyncio.gather(*pumps, client, everything, return_exceptions=True)
        for fut in writers:
            if fut.done() and not fut.cancelled() and (w := fut.result()) is not None:
                w.close()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()
    return ws
