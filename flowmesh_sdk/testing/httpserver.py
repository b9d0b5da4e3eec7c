"""The one HTTP server base of ``flowmesh_sdk.testing``: an ``aiohttp.web`` application on
127.0.0.1, served from a private event loop in a daemon thread.

Every emulator and fixture proxy here (price APIs, the registry token server, the
registry fault proxy, the EC2 fault proxy, the GCE and Azure emulators) is an
:class:`HttpServer` subclass that says only what it answers: override :meth:`handle`
(one coroutine for every method and path) or :meth:`routes`.  The base owns the rest:
listening (a free port by default, kept across :meth:`pause`/:meth:`resume`), the loop
thread (so a server keeps answering while the test's own thread or event loop is blocked
in a subprocess or a blocking client library), sync and async context managers, and a
handler that raises answering 500 with the error named instead of hanging the client.

HTTP parsing is aiohttp's (a maintained HTTP/1.1 server: keep-alive, chunked bodies,
HEAD, a TLS ClientHello refused with 400 at once); nothing here parses HTTP by hand.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import shutil
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from aiohttp import web

T = TypeVar("T")
log = logging.getLogger("flowmesh.testing")

__all__ = ["HttpServer", "LoopThread", "json_response", "self_signed_tls"]


class LoopThread:
    """An asyncio event loop running in a daemon thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                try:
                    pending = asyncio.all_tasks(loop)
                    for task in pending:
                        task.cancel()
                    if pending:
                        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

        self.loop = loop
        self._thread = threading.Thread(target=run, name=self._name, daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"{self._name}: event loop thread did not start")

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        """Run ``coro`` on the loop and wait for its result (from another thread)."""
        if self.loop is None:
            raise RuntimeError(f"{self._name} is not running")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None or self.loop is None:
            return
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self._thread = None
        self.loop = None


def self_signed_tls(directory: Path, common_name: str) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1 and localhost,
    made with the ``openssl`` CLI in ``directory`` (created 0700): ``server.crt`` is the CA
    a client verifies the server with (``REQUESTS_CA_BUNDLE``, a kubeconfig's
    ``certificate-authority-data``)."""
    directory.mkdir(mode=0o700)
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("a TLS fixture needs the openssl command: apt-get install -y openssl")
    proc = subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                           "-nodes", "-sha256", "-days", "7", "-subj", f"/CN={common_name}",
                           "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                           "-keyout", str(directory / "server.key"), "-out", str(directory / "server.crt")],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl req failed: {proc.stderr.strip()[-500:]}")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(directory / "server.crt", directory / "server.key")
    return ctx


def json_response(status: int, body: Any, headers: Mapping[str, str] | None = None,
                  content_type: str = "application/json") -> web.Response:
    """A JSON answer (``body`` serialised as is)."""
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=content_type,
                        headers=dict(headers or {}))


class HttpServer:
    """Base of every HTTP fixture here (see the module docstring).

    ``port`` 0 picks a free one.  ``client_max_size`` bounds a request body read with
    ``await request.read()`` (a proxy streams instead)."""

    name = "http-server"
    client_max_size = 64 << 20
    #: serve HTTPS with this context (a subclass sets it before :meth:`start`); None: HTTP
    ssl_context: ssl.SSLContext | None = None

    def __init__(self, *, port: int = 0) -> None:
        self._port_arg = port
        self._port: int | None = None
        self._loop = LoopThread(f"flowmesh-{self.name}")
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    # ---- what a subclass says ------------------------------------------------------
    def routes(self, app: web.Application) -> None:
        """Add the server's routes; the default sends every method and path to :meth:`handle`."""
        app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """The JSON body of an error the server itself answers (a fixture's bug: 500), in
        the emulated API's shape where a subclass says it."""
        return {"error": message}

    async def on_start(self) -> None:
        """Called on the server's loop once it listens (e.g. to make a client session)."""

    async def on_stop(self) -> None:
        """Called on the server's loop before it stops."""

    # ---- lifecycle -------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._port is not None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.name} is not running")
        return self._port

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @web.middleware
    async def _errors(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # a bug in a fixture must show, not hang the client
            log.exception("%s: %s %s failed", self.name, request.method, request.path)
            return json_response(500, self.error_body(500, f"{self.name} error: {type(exc).__name__}: {exc}"))

    async def _listen(self, port: int) -> int:
        if self._runner is None:
            app = web.Application(client_max_size=self.client_max_size, middlewares=[self._errors])
            self.routes(app)
            self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", port, reuse_address=True, ssl_context=self.ssl_context)
        await self._site.start()
        server = cast("asyncio.Server | None", self._site._server)   # the asyncio server: the port actually bound
        assert server is not None and server.sockets
        return int(server.sockets[0].getsockname()[1])

    def _cut_connections(self) -> None:
        server = self._runner.server if self._runner is not None else None
        for handler in list(getattr(server, "connections", ()) or ()):
            transport = handler.transport
            if transport is not None:
                transport.abort()

    async def _unlisten(self) -> None:
        site, self._site = self._site, None
        if site is not None:
            await site.stop()
        self._cut_connections()

    async def _close(self) -> None:
        await self._unlisten()
        try:
            await self.on_stop()
        finally:
            runner, self._runner = self._runner, None
            if runner is not None:
                await runner.cleanup()

    def start(self) -> Any:
        if self._port is not None:
            return self
        self._loop.start()
        try:
            self._port = self._loop.call(self._listen(self._port_arg))
            self._loop.call(self.on_start())
        except BaseException:
            self._port = None
            self._loop.stop()
            raise
        return self

    def stop(self) -> None:
        if self._loop.loop is not None:
            try:
                self._loop.call(self._close(), timeout=10)
            except Exception:  # noqa: BLE001 - stopping a fixture is best effort
                pass
        self._loop.stop()
        self._port = None

    def pause(self) -> None:
        """Stop listening and cut open connections (clients get connection refused)."""
        if self._port is not None and self._site is not None:
            self._loop.call(self._unlisten())

    def resume(self) -> None:
        """Listen again on the same port."""
        if self._port is not None and self._site is None:
            self._loop.call(self._listen(self._port))

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 30.0) -> T:
        """Run ``coro`` on the server's loop (from another thread)."""
        return self._loop.call(coro, timeout)

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Any:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
