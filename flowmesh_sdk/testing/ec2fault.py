"""A test fixture: a fault-injecting HTTP proxy between boto3 and an EC2 endpoint (moto).

``Ec2FaultProxy`` listens on 127.0.0.1 and forwards every request to one upstream
(``MotoEc2().endpoint_url``).  It reads the EC2 Query action from the form-encoded body
(``Action=RunInstances&...``), counts calls per action, and on demand answers chosen
actions with a real EC2 error instead of forwarding, or delays them::

    with MotoEc2() as moto, Ec2FaultProxy(moto.endpoint_url) as proxy:
        provider = moto.provider(endpoint_url=proxy.endpoint_url)
        proxy.fail("RunInstances", "InsufficientInstanceCapacity",
                   when=lambda p: p.get("InstanceType") == "c5.2xlarge")
        proxy.delay("DescribeInstances", 0.5)
        ...
        proxy.calls["RunInstances"]          # how many RunInstances reached the proxy
        proxy.params("RunInstances")         # their decoded form parameters

The error body is EC2's error response format ("Error codes for the Amazon EC2 API",
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html#api-error-response)::

    <Response><Errors><Error><Code>CODE</Code><Message>MESSAGE</Message></Error></Errors>
    <RequestID>UUID</RequestID></Response>

which botocore's EC2 parser turns into a ``ClientError`` exactly as for the real service.
HTTP status per code (:data:`STATUS`): EC2's *server* errors are 5xx --
``RequestLimitExceeded``, ``Unavailable`` and ``ServiceUnavailable`` 503 (503 is what
botocore's retry table matches ``RequestLimitExceeded`` on), the ``Insufficient*Capacity``
family and ``InternalError`` 500; ``AuthFailure`` 401, ``UnauthorizedOperation`` 403;
every other (client) code 400.  Pass ``status=`` to override.

It is a fixture for tests, not a general proxy: plain HTTP, one upstream, the whole
request body read into memory.  It is an :class:`~flowmesh_sdk.testing.httpserver.HttpServer`
(aiohttp, its own event loop in a daemon thread; a delay is an ``asyncio.sleep`` there, so
other calls go on), so it keeps answering while the test's event loop (or a worker thread) waits; the fault
and counter methods are thread-safe.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web

from .httpserver import HttpServer

__all__ = ["Ec2Call", "Ec2FaultProxy", "STATUS", "error_body"]

STATUS: dict[str, int] = {
    "RequestLimitExceeded": 503,
    "Unavailable": 503,
    "ServiceUnavailable": 503,
    "InsufficientInstanceCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientAddressCapacity": 500,
    "InsufficientVolumeCapacity": 500,
    "InternalError": 500,
    "InternalFailure": 500,
    "AuthFailure": 401,
    "UnauthorizedOperation": 403,
}
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
               "te", "trailer", "transfer-encoding", "upgrade", "expect", "content-length"}

Params = Mapping[str, str]


def error_body(code: str, message: str, request_id: str | None = None) -> bytes:
    """An EC2 error response document."""
    rid = request_id or str(uuid.uuid4())
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
            f"</Error></Errors><RequestID>{rid}</RequestID></Response>").encode()


@dataclass(frozen=True)
class Ec2Call:
    """One request the proxy saw (faulted or forwarded)."""

    action: str
    params: Mapping[str, str]
    faulted: str | None = None      # the error code answered, if any


@dataclass
class _Fault:
    action: str
    code: str
    times: int | None
    when: Callable[[Params], bool] | None
    status: int
    message: str


@dataclass
class _Delay:
    action: str
    seconds: float
    times: int | None


@dataclass
class _State:
    faults: list[_Fault] = field(default_factory=list)
    delays: list[_Delay] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    log: list[Ec2Call] = field(default_factory=list)


class Ec2FaultProxy(HttpServer):
    """A fault-injecting HTTP proxy in front of an EC2 endpoint (a test fixture)."""

    name = "ec2-fault-proxy"

    def __init__(self, upstream: str, *, port: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {upstream!r}")
        super().__init__(port=port)
        self._upstream = f"http://{parsed.hostname}:{parsed.port or 80}"
        self._lock = threading.Lock()
        self._state = _State()
        self._session: aiohttp.ClientSession | None = None
        self.endpoint_url = ""

    # ---- faults --------------------------------------------------------------------
    def fail(self, action: str, code: str, *, times: int | None = 1,
             when: Callable[[Params], bool] | None = None, status: int | None = None,
             message: str | None = None) -> None:
        """Answer the next ``times`` calls of ``action`` (all, for None) for which
        ``when(params)`` holds with the EC2 error ``code``."""
        with self._lock:
            self._state.faults.append(_Fault(action, code, times, when, status or STATUS.get(code, 400),
                                             message or f"injected by the test fixture: {code}"))

    def delay(self, action: str, seconds: float, *, times: int | None = None) -> None:
        """Hold the next ``times`` calls of ``action`` (all, for None) ``seconds`` before forwarding."""
        with self._lock:
            self._state.delays.append(_Delay(action, seconds, times))

    def clear(self) -> None:
        """Drop every fault and delay (counters stay)."""
        with self._lock:
            self._state.faults.clear()
            self._state.delays.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self._state.calls.clear()
            self._state.log.clear()

    @property
    def calls(self) -> Counter[str]:
        """Calls per action so far (a copy)."""
        with self._lock:
            return Counter(self._state.calls)

    @property
    def log(self) -> list[Ec2Call]:
        with self._lock:
            return list(self._state.log)

    def params(self, action: str) -> list[dict[str, str]]:
        """The form parameters of every call of ``action`` so far."""
        return [dict(c.params) for c in self.log if c.action == action]

    # ---- the request path (handler threads) ----------------------------------------
    def _decide(self, action: str, params: Params) -> tuple[_Fault | None, float]:
        with self._lock:
            self._state.calls[action] += 1
            fault = None
            for f in self._state.faults:
                if f.action == action and (f.times is None or f.times > 0) and (f.when is None or f.when(params)):
                    if f.times is not None:
                        f.times -= 1
                    fault = f
                    break
            self._state.faults = [f for f in self._state.faults if f.times is None or f.times > 0]
            wait = 0.0
            for d in self._state.delays:
                if d.action == action and (d.times is None or d.times > 0):
                    if d.times is not None:
                        d.times -= 1
                    wait = d.seconds
                    break
            self._state.delays = [d for d in self._state.delays if d.times is None or d.times > 0]
            self._state.log.append(Ec2Call(action, dict(params), fault.code if fault else None))
            return fault, wait

    # ---- the request path (the server's loop) ---------------------------------------
    async def on_start(self) -> None:
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=120))

    async def on_stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    @staticmethod
    def _xml(status: int, data: bytes) -> web.Response:
        return web.Response(status=status, body=data, headers={"Content-Type": "text/xml;charset=UTF-8"})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        form = dict(urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        if not form:
            form = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.raw_path).query))
        action = form.get("Action", "")
        fault, wait = self._decide(action, form)
        if wait > 0:
            await asyncio.sleep(wait)
        if fault is not None:
            return self._xml(fault.status, error_body(fault.code, fault.message))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        assert self._session is not None
        try:
            async with self._session.request(request.method, self._upstream + request.raw_path, data=body,
                                             headers=headers, allow_redirects=False,
                                             skip_auto_headers=("Accept-Encoding", "User-Agent",
                                                                "Content-Type")) as resp:
                data = await resp.read()
                out = web.Response(status=resp.status, reason=resp.reason, body=data)
                for k, v in resp.headers.items():
                    if k.lower() not in _HOP_BY_HOP:
                        out.headers.add(k, v)
                return out
        except (aiohttp.ClientError, OSError) as exc:
            return self._xml(502, error_body("InternalError", f"fault proxy: upstream failed: {exc}"))

    # ---- lifecycle -----------------------------------------------------------------
    def start(self) -> Ec2FaultProxy:
        super().start()
        self.endpoint_url = self.url
        return self
