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
kept alive (HTTP/1.1); each request uses a fresh upstream connection.  The ``Host`` header is
passed through unchanged, so the registry's absolute ``Location`` headers point back at the
proxy.  A TLS handshake (podman
tries https first with ``--tls-verify=false``) gets aiohttp's plain-HTTP ``400`` at once,
so the client falls back to http without waiting.

The proxy is an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` (aiohttp.web, its own
event loop in a daemon thread; bodies streamed both ways with aiohttp's client), so it keeps
forwarding while the test blocks in ``subprocess.run(["podman", ...])``; the
fault and counter methods are thread-safe.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from .httpserver import HttpServer, json_response

__all__ = ["FaultProxy", "ProxyRecord"]

_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
               "proxy-authorization", "te", "trailer", "upgrade", "expect", "transfer-encoding"}
_V2_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/?]+)$")
_COPY_CHUNK = 256 * 1024
_ERROR_CODES = {429: "TOOMANYREQUESTS", 401: "UNAUTHORIZED", 403: "DENIED", 404: "NOT_FOUND",
                503: "UNAVAILABLE"}
_REGISTRY_HEADERS = {"Docker-Distribution-Api-Version": "registry/2.0"}
_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


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


class FaultProxy(HttpServer):
    """A test fixture: reverse proxy with fault injection (see the module docstring).

    ``upstream``: ``host:port`` of the registry (e.g. ``reg.host``).  ``port``: where to
    listen (default: a free port, kept across ``down()``/``up()``).
    """

    name = "faultproxy"

    def __init__(self, upstream: str, *, port: int = 0, idle_timeout: float = 60.0) -> None:
        host, _, uport = upstream.rpartition(":")
        if not host or not uport.isdigit():
            raise ValueError(f"upstream must be host:port, not {upstream!r}")
        super().__init__(port=port)
        self.upstream_host, self.upstream_port = host, int(uport)
        self.idle_timeout = idle_timeout
        self._session: aiohttp.ClientSession | None = None
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
        where = self.host if self.running else "stopped"
        return f"FaultProxy({where} -> {self.upstream_host}:{self.upstream_port})"

    async def on_start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True, limit=0),
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_read=self.idle_timeout))

    async def on_stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

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
        self.pause()

    def up(self) -> None:
        """Listen again on the same port."""
        with self._lock:
            self._down = False
        self.resume()

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

    async def handle(self, request: web.Request) -> web.StreamResponse:
        method, target = request.method, request.raw_path
        kind, ref = _classify(target)
        self._count(method, kind, ref)
        fail = self._take_fail(kind)
        if fail is not None:
            await request.read()   # drain the body so the connection stays usable
            status, retry_after = fail
            extra = {"Retry-After": str(retry_after)} if retry_after is not None else {}
            body = {"errors": [{"code": _ERROR_CODES.get(status, "UNKNOWN"),
                                "message": f"injected by FaultProxy ({status})"}]}
            # Recorded before the answer goes out, so a client that has it sees the record.
            self._record(ProxyRecord(method, target, kind, status, "fail"))
            return json_response(status, body, {**_REGISTRY_HEADERS, **extra})

        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        skip = [h for h in _AUTO_HEADERS if h not in request.headers]
        data = request.content.iter_chunked(_COPY_CHUNK) if request.body_exists else None
        url = f"http://{self.upstream_host}:{self.upstream_port}{target}"
        assert self._session is not None
        try:
            upstream = await self._session.request(method, url, headers=headers, data=data,
                                                   allow_redirects=False, skip_auto_headers=skip)
        except (aiohttp.ClientError, OSError):
            self._record(ProxyRecord(method, target, kind, 502, "upstream-down"))
            return json_response(502, {"errors": [{"code": "UNAVAILABLE", "message": "upstream unreachable"}]},
                                 _REGISTRY_HEADERS)
        async with upstream:
            status = upstream.status
            no_body = method == "HEAD" or status in (204, 304)
            length = upstream.content_length
            corrupt = (not no_body and method == "GET" and kind == "blob" and 200 <= status < 300
                       and length != 0 and self._take_corrupt())
            resp = web.StreamResponse(status=status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                    resp.headers.add(k, v)
            if length is not None:
                resp.content_length = length
            index = self._record(ProxyRecord(method, target, kind, status, "corrupt" if corrupt else None,
                                             complete=no_body))
            await resp.prepare(request)
            if not no_body:
                try:
                    async for chunk in upstream.content.iter_chunked(_COPY_CHUNK):
                        if corrupt and chunk:
                            chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                            corrupt = False
                        await resp.write(chunk)
                except (aiohttp.ClientError, ConnectionError):
                    if request.transport is not None:
                        request.transport.abort()   # cut short: the client sees a broken body
                    return resp
            await resp.write_eof()
            if not no_body:
                self._update(index, complete=True)
        return resp
