"""A test fixture: a fault-injecting HTTP/1.1 reverse proxy in front of a registry.

``FaultProxy`` listens on 127.0.0.1 and forwards every request to one upstream (a
``LocalRegistry``), so a client pulling ``PROXYHOST/name:tag`` talks to the registry
through it.  It counts what goes through (manifest GETs, blob GETs per digest) and
injects faults when asked::

    with LocalRegistry() as reg, FaultProxy(reg.host) as proxy:
        reg.push("localhost/flowmesh/busybox:1", "flowmesh/busybox:1")
        proxy.fail_next(2, status=429, retry_after=1)   # the next 2 requests: 429
        proxy.corrupt_next_blob()                         # the next blob body: a flipped byte
        proxy.down(); proxy.up()                          # connection refused, then back
        # pull 127.0.0.1:{proxy.port}/flowmesh/busybox:1 --tls-verify=false
        proxy.blob_gets  # {"sha256:...": 1, ...}

It is meant for pulls (GET/HEAD); request bodies (Content-Length or chunked) are
forwarded too, so pushes work, but nothing is counted for them.  Client connections are
kept alive (HTTP/1.1); each request uses a fresh upstream connection with
``Connection: close``.  The ``Host`` header is passed through unchanged, so the
registry's absolute ``Location`` headers point back at the proxy.  A TLS handshake (podman
tries https first with ``--tls-verify=false``) gets a plain-HTTP ``400`` at once, so the
client falls back to http without waiting.

The proxy runs its own event loop in a daemon thread (asyncio streams, no framework),
so it keeps forwarding while the test blocks in ``subprocess.run(["podman", ...])``; the
fault and counter methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from flowmesh_sdk.testing.tokenserver import _LoopThread

__all__ = ["FaultProxy", "ProxyRecord"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
               "proxy-authorization", "te", "trailer", "upgrade", "expect"}
_V2_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/?]+)$")
_COPY_CHUNK = 256 * 1024
_REASONS = {400: "Bad Request", 408: "Request Timeout", 429: "Too Many Requests",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}
_ERROR_CODES = {429: "TOOMANYREQUESTS", 401: "UNAUTHORIZED", 403: "DENIED", 404: "NOT_FOUND",
                503: "UNAVAILABLE"}


@dataclass(frozen=True)
class ProxyRecord:
    """One request the proxy answered."""

    method: str
    path: str
    kind: str            # "manifest", "blob", "upload" or "other"
    status: int          # the status the client got (0: the connection broke before it)
    fault: str | None    # "fail", "corrupt", "upstream-down" or None
    complete: bool = True  # False: the body was cut short (or is still being sent)


def _classify(path: str) -> tuple[str, str | None]:
    path = path.split("?", 1)[0]
    if "/blobs/uploads" in path:
        return "upload", None
    m = _V2_PATH.match(path)
    if not m:
        return "other", None
    return ("manifest" if m.group("kind") == "manifests" else "blob"), m.group("ref")


class _BadRequest(Exception):
    def __init__(self, status: int = 400) -> None:
        self.status = status


class FaultProxy:
    """A test fixture: reverse proxy with fault injection (see the module docstring).

    ``upstream``: ``host:port`` of the registry (e.g. ``reg.host``).  ``port``: where to
    listen (default: a free port, kept across ``down()``/``up()``).
    """

    def __init__(self, upstream: str, *, port: int = 0, idle_timeout: float = 60.0) -> None:
        host, _, uport = upstream.rpartition(":")
        if not host or not uport.isdigit():
            raise ValueError(f"upstream must be host:port, not {upstream!r}")
        self.upstream_host, self.upstream_port = host, int(uport)
        self._port_arg = port
        self._port: int | None = None
        self.idle_timeout = idle_timeout
        self._loop = _LoopThread("flowmesh-faultproxy")
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._lock = threading.Lock()
        # faults
        self._fail: list[tuple[int, int | None, str | None]] = []   # (status, retry_after, kind)
        self._corrupt = 0
        self._down = False
        # counters
        self._records: list[ProxyRecord] = []
        self._manifest_gets = 0
        self._blob_gets: Counter[str] = Counter()

    def __repr__(self) -> str:
        where = self.host if self._port else "stopped"
        return f"FaultProxy({where} -> {self.upstream_host}:{self.upstream_port})"

    # ---- lifecycle -------------------------------------------------------- #

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not running")
        return self._port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT`` -- use it as the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> "FaultProxy":
        if self._port is not None:
            return self
        self._loop.start()
        try:
            self._port = self._loop.call(self._listen(self._port_arg))
        except BaseException:
            self._loop.stop()
            raise
        return self

    def stop(self) -> None:
        if self._loop.loop is not None:
            try:
                self._loop.call(self._close(), timeout=10)
            except Exception:
                pass
        self._loop.stop()
        self._port = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> "FaultProxy":
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)

    async def _listen(self, port: int) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port,
                                                  limit=1 << 20, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._conns):
            writer.transport.abort()
        self._conns.clear()

    # ---- faults ----------------------------------------------------------- #

    def fail_next(self, n: int = 1, status: int = 429, retry_after: int | None = 1,
                  *, kind: str | None = None) -> None:
        """Answer the next ``n`` requests (of ``kind``: "manifest", "blob", "other"; default
        any) with ``status`` and a registry-style JSON error, without asking upstream.
        ``retry_after`` (seconds) becomes a ``Retry-After`` header; None leaves it out."""
        with self._lock:
            self._fail.extend([(status, retry_after, kind)] * n)

    def corrupt_next_blob(self, n: int = 1) -> None:
        """Flip the first byte of the next ``n`` successful blob GET bodies (same length,
        wrong digest)."""
        with self._lock:
            self._corrupt += n

    def clear_faults(self) -> None:
        with self._lock:
            self._fail.clear()
            self._corrupt = 0

    def down(self) -> None:
        """Stop listening and cut open connections: clients get connection refused."""
        with self._lock:
            self._down = True
        if self._port is not None:
            self._loop.call(self._close())

    def up(self) -> None:
        """Listen again on the same port."""
        with self._lock:
            self._down = False
        if self._port is not None and self._server is None:
            self._loop.call(self._listen(self._port))

    @property
    def is_down(self) -> bool:
        with self._lock:
            return self._down

    # ---- counters --------------------------------------------------------- #

    @property
    def manifest_gets(self) -> int:
        with self._lock:
            return self._manifest_gets

    @property
    def blob_gets(self) -> dict[str, int]:
        """GETs received per blob digest (faulted ones included)."""
        with self._lock:
            return dict(self._blob_gets)

    @property
    def records(self) -> list[ProxyRecord]:
        with self._lock:
            return list(self._records)

    def reset_counts(self) -> None:
        with self._lock:
            self._records.clear()
            self._manifest_gets = 0
            self._blob_gets.clear()

    def _count(self, method: str, kind: str, ref: str | None) -> None:
        with self._lock:
            if method == "GET" and kind == "manifest":
                self._manifest_gets += 1
            elif method == "GET" and kind == "blob" and ref:
                self._blob_gets[ref] += 1

    def _take_fail(self, kind: str) -> tuple[int, int | None] | None:
        with self._lock:
            for i, (status, retry_after, want) in enumerate(self._fail):
                if want is None or want == kind:
                    del self._fail[i]
                    return status, retry_after
        return None

    def _take_corrupt(self) -> bool:
        with self._lock:
            if self._corrupt > 0:
                self._corrupt -= 1
                return True
        return False

    def _record(self, rec: ProxyRecord) -> ProxyRecord:
        with self._lock:
            self._records.append(rec)
        return rec

    def _update(self, rec: ProxyRecord | None, **changes: Any) -> None:
        with self._lock:
            for i in range(len(self._records) - 1, -1, -1):
                if self._records[i] is rec:
                    self._records[i] = dataclasses.replace(rec, **changes)
                    return

    # ---- HTTP ------------------------------------------------------------- #

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            first = True
            while True:
                try:
                    head = await self._read_head(reader, first)
                except _BadRequest as exc:
                    await self._send_simple(writer, exc.status, {"errors": [{"code": "BAD_REQUEST"}]},
                                            close=True)
                    return
                if head is None:
                    return
                first = False
                keep_alive = await self._serve_one(head, reader, writer)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _read_head(self, reader: asyncio.StreamReader, first: bool) -> bytes | None:
        """The request head, None on a clean close between requests."""
        try:
            if first:
                byte = await asyncio.wait_for(reader.read(1), self.idle_timeout)
                if not byte:
                    return None
                if byte == b"\x16":   # a TLS ClientHello: say no in plain HTTP at once
                    raise _BadRequest(400)
                rest = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout)
                return byte + rest
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_timeout)
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise _BadRequest(400) from None
            return None
        except asyncio.LimitOverrunError:
            raise _BadRequest(431) from None
        except asyncio.TimeoutError:
            return None

    @staticmethod
    def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise _BadRequest(400)
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            if ":" not in line:
                raise _BadRequest(400)
            k, v = line.split(":", 1)
            headers.append((k.strip(), v.strip()))
        return parts[0], parts[1], parts[2], headers

    async def _serve_one(self, head: bytes, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True if the client connection stays open."""
        try:
            method, target, version, headers = self._parse_head(head)
        except _BadRequest as exc:
            await self._send_simple(writer, exc.status, {"errors": [{"code": "BAD_REQUEST"}]}, close=True)
            return False
        hmap = {k.lower(): v for k, v in headers}
        conn_tokens = {t.strip().lower() for t in hmap.get("connection", "").split(",")}
        keep_alive = ("close" not in conn_tokens) if version == "HTTP/1.1" else ("keep-alive" in conn_tokens)
        chunked_req = "chunked" in hmap.get("transfer-encoding", "").lower()
        req_length = int(hmap.get("content-length", "0") or 0) if not chunked_req else None
        kind, ref = _classify(target)
        self._count(method, kind, ref)

        fail = self._take_fail(kind)
        if fail is not None:
            # Drain the request body first so the connection stays usable.
            await self._copy_body(reader, None, req_length, chunked_req)
            status, retry_after = fail
            extra = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            body = {"errors": [{"code": _ERROR_CODES.get(status, "UNKNOWN"),
                                "message": f"injected by FaultProxy ({status})"}]}
            # Recorded before the answer goes out, so a client that has it sees the record.
            self._record(ProxyRecord(method, target, kind, status, "fail"))
            await self._send_simple(writer, status, body, close=not keep_alive, extra=extra,
                                    head_only=method == "HEAD")
            return keep_alive

        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port,
                                                                 limit=1 << 20)
        except OSError:
            await self._copy_body(reader, None, req_length, chunked_req)
            self._record(ProxyRecord(method, target, kind, 502, "upstream-down"))
            await self._send_simple(writer, 502, {"errors": [{"code": "UNAVAILABLE",
                                                              "message": "upstream unreachable"}]},
                                    close=not keep_alive, head_only=method == "HEAD")
            return keep_alive

        status = 0
        fault: str | None = None
        index: ProxyRecord | None = None
        try:
            out = [f"{method} {target} HTTP/1.1"]
            out += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP_BY_HOP]
            out.append("Connection: close")
            up_writer.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            await self._copy_body(reader, up_writer, req_length, chunked_req)

            while True:
                resp_head = await up_reader.readuntil(b"\r\n\r\n")
                status_line, *resp_lines = resp_head.decode("latin-1").split("\r\n")
                status = int(status_line.split(" ", 2)[1])
                if status >= 200 or status == 101:
                    break   # 1xx interim answers (we strip Expect, so rare) are dropped
            resp_headers = []
            for line in resp_lines:
                if line and ":" in line:
                    k, v = line.split(":", 1)
                    resp_headers.append((k.strip(), v.strip()))
            rmap = {k.lower(): v for k, v in resp_headers}
            no_body = method == "HEAD" or status in (204, 304) or 100 <= status < 200
            chunked = "chunked" in rmap.get("transfer-encoding", "").lower()
            length = None if chunked else (int(rmap["content-length"]) if "content-length" in rmap else None)
            close_delimited = not no_body and not chunked and length is None
            if close_delimited:
                keep_alive = False
            corrupt = (not no_body and method == "GET" and kind == "blob" and 200 <= status < 300
                       and length != 0 and self._take_corrupt())
            if corrupt:
                fault = "corrupt"

            lines = [status_line] + [f"{k}: {v}" for k, v in resp_headers
                                     if k.lower() not in ("connection", "keep-alive")]
            lines.append("Connection: keep-alive" if keep_alive else "Connection: close")
            index = self._record(ProxyRecord(method, target, kind, status, fault, complete=no_body))
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            if not no_body:
                if chunked:
                    await self._copy_chunked(up_reader, writer, corrupt)
                else:
                    await self._copy_exact(up_reader, writer, length, corrupt)
            await writer.drain()
            if not no_body:
                self._update(index, complete=True)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            keep_alive = False
            if index is None:
                # Nothing sent yet: tell the client upstream broke.
                self._record(ProxyRecord(method, target, kind, 502, "upstream-down"))
                try:
                    await self._send_simple(writer, 502, {"errors": [{"code": "UNAVAILABLE"}]}, close=True)
                except ConnectionError:
                    pass
        finally:
            up_writer.close()
        return keep_alive

    # ---- body copying ----------------------------------------------------- #

    async def _copy_body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                         length: int | None, chunked: bool) -> None:
        """A request body to ``writer`` (None: read and drop it)."""
        if chunked:
            await self._copy_chunked(reader, writer, False)
        elif length:
            await self._copy_exact(reader, writer, length, False)

    @staticmethod
    async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                          length: int | None, corrupt: bool) -> None:
        """``length`` bytes (None: until EOF), the first one flipped when ``corrupt``."""
        remaining = length
        while remaining is None or remaining > 0:
            n = _COPY_CHUNK if remaining is None else min(_COPY_CHUNK, remaining)
            data = await reader.read(n)
            if not data:
                if remaining is None:
                    return
                raise asyncio.IncompleteReadError(b"", remaining)
            if corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
                corrupt = False
            if remaining is not None:
                remaining -= len(data)
            if writer is not None:
                writer.write(data)
                await writer.drain()

    @staticmethod
    async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None,
                            corrupt: bool) -> None:
        """A chunked body, framing kept as is; the first data byte flipped when ``corrupt``."""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if writer is not None:
                writer.write(size_line)
            if size == 0:
                # Trailers, then the empty line.
                while True:
                    line = await reader.readuntil(b"\r\n")
                    if writer is not None:
                        writer.write(line)
                    if line == b"\r\n":
                        break
                if writer is not None:
                    await writer.drain()
                return
            remaining = size
            while remaining > 0:
                data = await reader.read(min(_COPY_CHUNK, remaining))
                if not data:
                    raise asyncio.IncompleteReadError(b"", remaining)
                if corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                    corrupt = False
                remaining -= len(data)
                if writer is not None:
                    writer.write(data)
                    await writer.drain()
            crlf = await reader.readexactly(2)
            if writer is not None:
                writer.write(crlf)

    @staticmethod
    async def _send_simple(writer: asyncio.StreamWriter, status: int, body: dict[str, Any], *,
                           close: bool, extra: dict[str, str] | None = None,
                           head_only: bool = False) -> None:
        data = json.dumps(body).encode()
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
                 "Content-Type: application/json; charset=utf-8",
                 "Docker-Distribution-Api-Version: registry/2.0",
                 f"Content-Length: {len(data)}",
                 "Connection: close" if close else "Connection: keep-alive"]
        lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else data))
        await writer.drain()
