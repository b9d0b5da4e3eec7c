"""The HTTP server: SandboxFusion's ``POST /run_code`` and ``POST /run_jupyter`` (and its
``GET /v1/ping``) in front of a FlowMesh pool, each request in a fresh sandbox.

Answers, as SandboxFusion's own server gives them (bytedance/SandboxFusion
``sandbox/server/sandbox_api.py``): HTTP 200 with ``status`` ``Success`` or ``Failed`` for a
request that ran, and HTTP 200 with ``status: "SandboxError"`` and a ``message`` for one
the server could not run -- a language it does not serve, a FlowMesh error (no capacity,
over budget, the image missing, the pool draining), the queue full ("overloaded"), no slot
within ``queue_timeout_s``.  A body that is not a request (not JSON, a field of the wrong
type, a language SandboxFusion does not know) gets 422 as FastAPI's validation gives,
with the same ``status``/``message`` shape and ``detail``; nothing answers 500.  The
``sandbox-fusion`` client raises (and retries) on ``SandboxError`` and on non-200 alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from aiohttp import web

from ... import timers
from ...errors import FlowMeshError, PoolClosedError, SpecError
from ...sandbox import Sandbox
from ...specs import check_number
from .admission import Admission, Admit, pool_slots
from .languages import DEFAULT_LANGUAGES, LanguageSpec, with_images
from .models import (SANDBOX_FUSION_LANGUAGES, RunCodeRequest, RunCodeResponse, RunJupyterRequest,
                     RunJupyterResponse, RunStatus)
from .runner import decode_files, execute_code, execute_jupyter, sandbox_spec

__all__ = ["SandboxFusionServer", "ServerConfig"]

log = logging.getLogger("flowmesh.integrations.sandbox_fusion")

JUPYTER_IMAGE_LANGUAGE = "python"   # /run_jupyter runs in the python language's image


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How the server listens and admits.  ``port`` 0 takes a free port; ``slots`` None is
    the pool's capacity; ``queue_size`` requests wait beyond them (more are answered
    "overloaded" at once), each at most ``queue_timeout_s``; a request's sandbox start and
    file transfers get ``setup_timeout_s`` beyond its own compile and run timeouts, which
    may be at most ``max_timeout_s`` each."""

    host: str = "127.0.0.1"
    port: int = 0
    languages: Mapping[str, LanguageSpec] = field(default_factory=lambda: dict(DEFAULT_LANGUAGES))
    slots: int | None = None
    queue_size: int = 256
    queue_timeout_s: float = 600.0
    setup_timeout_s: float = 300.0
    max_timeout_s: float = 3600.0
    max_body_mb: float = 64.0
    shutdown_timeout_s: float = 60.0
    tenant: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise SpecError("server.host", f"must be an address to listen on, got {self.host!r}")
        check_number("server.port", self.port, lo=0, hi=65535, integer=True)
        if self.slots is not None:
            check_number("server.slots", self.slots, lo=1, hi=1_000_000, integer=True)
        check_number("server.queue_size", self.queue_size, lo=0, hi=1_000_000, integer=True)
        for name in ("queue_timeout_s", "setup_timeout_s", "max_timeout_s", "shutdown_timeout_s"):
            check_number(f"server.{name}", getattr(self, name), lo=0, hi=7 * 86400, lo_open=True)
        check_number("server.max_body_mb", self.max_body_mb, lo=0, hi=4096, lo_open=True)
        if not self.languages:
            raise SpecError("server.languages", "must name at least one language")
        for name, lang in self.languages.items():
            if not isinstance(lang, LanguageSpec) or lang.name != name:
                raise SpecError(f"server.languages[{name!r}]", "must be a LanguageSpec of that name")


def _fail_code(message: str) -> dict[str, Any]:
    return RunCodeResponse(RunStatus.SandboxError, message).to_json()


def _fail_jupyter(message: str) -> dict[str, Any]:
    return RunJupyterResponse(RunStatus.SandboxError, message).to_json()


def _invalid(fail: Callable[[str], dict[str, Any]], exc: SpecError) -> web.Response:
    """422, FastAPI's answer to a body that fails validation (``detail``, each entry's
    ``loc`` the field in the body), in SandboxFusion's shape too."""
    _, dot, name = exc.field.partition(".")
    loc = ["body", *([name] if dot else [])]
    body = {**fail(str(exc)), "detail": [{"loc": loc, "msg": str(exc), "type": "value_error"}]}
    return web.json_response(body, status=422)


class SandboxFusionServer:
    """A SandboxFusion-compatible server on ``pool`` (a FlowMesh pool, made on this loop).

        async with SandboxFusionServer(pool, ServerConfig(port=8080)) as server:
            print(server.url)          # sandbox_fusion.set_endpoint(server.url)

    ``images`` replaces the image of the languages it names.  :meth:`stop` stops listening,
    answers what is queued with ``SandboxError``, lets what runs finish (up to
    ``shutdown_timeout_s``) and, with ``drain_pool=True``, drains the pool."""

    def __init__(self, pool: Any, config: ServerConfig | None = None, *,
                 images: Mapping[str, str] | None = None) -> None:
        cfg = config or ServerConfig()
        if images:
            cfg = replace(cfg, languages=with_images(cfg.languages, images))
        if not callable(getattr(pool, "sandbox", None)) or not callable(getattr(pool, "default_sandbox", None)):
            raise SpecError("server.pool", f"must be a FlowMesh pool, got {type(pool).__name__}")
        self.pool = pool
        self.config = cfg
        self.admission = Admission(cfg.slots or pool_slots(pool), cfg.queue_size)
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()   # requests' sandboxes, torn down after their answer
        self._port: int | None = None

    # ---- lifecycle ---------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise PoolClosedError("the server is not listening (call start())")
        return self._port

    @property
    def url(self) -> str:
        """The endpoint: what ``sandbox_fusion.set_endpoint`` takes (verl's
        ``sandbox_fusion_url`` is :attr:`run_code_url`)."""
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    @property
    def run_code_url(self) -> str:
        return f"{self.url}/run_code"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=int(self.config.max_body_mb * (1 << 20)),
                              middlewares=[self._never_500])
        app.router.add_post("/run_code", self._run_code)
        app.router.add_post("/run_jupyter", self._run_jupyter)
        app.router.add_get("/v1/ping", self._ping)
        app.router.add_get("/flowmesh/stats", self._stats)
        return app

    async def start(self) -> SandboxFusionServer:
        if self._runner is not None:
            return self
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=self.config.shutdown_timeout_s)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port, backlog=1024)
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise SpecError("server.port", f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        log.info("sandbox-fusion server on %s (%d slots, queue %d)", self.url, self.admission.slots,
                 self.admission.queue_size)
        return self

    async def stop(self, *, drain_pool: bool = False) -> None:
        self.admission.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._tasks:   # each bounded by its own timeouts
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        if drain_pool:
            await self.pool.drain()

    async def __aenter__(self) -> SandboxFusionServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- handlers ----------------------------------------------------------------------
    @web.middleware
    async def _never_500(self, request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:   # noqa: BLE001 - the HTTP boundary: an answer, never a 500
            log.exception("sandbox-fusion %s: unexpected error", request.path)
            fail = _fail_jupyter if request.path == "/run_jupyter" else _fail_code
            return web.json_response(fail(f"internal error: {type(exc).__name__}: {exc}"))

    async def _ping(self, request: web.Request) -> web.Response:
        return web.json_response("pong")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(asdict(self.admission.stats()))

    async def _body(self, request: web.Request) -> Any:
        try:
            return await request.json()   # a body over max_body_mb: aiohttp's 413
        except (ValueError, UnicodeDecodeError) as exc:
            raise SpecError("body", f"must be a JSON object: {exc}") from None

    async def _run_code(self, request: web.Request) -> web.StreamResponse:
        try:
            req = RunCodeRequest.from_json(await self._body(request))
        except SpecError as exc:
            return _invalid(_fail_code, exc)
        if req.language not in SANDBOX_FUSION_LANGUAGES:
            return _invalid(_fail_code, SpecError("run_code.language", f"{req.language!r} is not a SandboxFusion "
                                                  f"language (allowed: {', '.join(SANDBOX_FUSION_LANGUAGES)})"))
        lang = self.config.languages.get(req.language)
        if lang is None:
            return web.json_response(_fail_code(f"run_code.language: {req.language!r} is not served here; "
                                                f"this server runs {', '.join(sorted(self.config.languages))}"))
        try:
            self._check_timeouts("run_code", compile_timeout=req.compile_timeout, run_timeout=req.run_timeout)
            files = decode_files(req.files, "run_code")
        except SpecError as exc:
            return web.json_response(_fail_code(str(exc)))
        budget = (req.compile_timeout if lang.compile else 0.0) + req.run_timeout
        answer = await self._in_sandbox(lang.image, req.memory_limit_MB, budget, f"sandbox-fusion-{lang.name}",
                                        lambda sb: execute_code(sb, lang, req, files), _fail_code)
        return web.json_response(answer)

    async def _run_jupyter(self, request: web.Request) -> web.StreamResponse:
        try:
            req = RunJupyterRequest.from_json(await self._body(request))
        except SpecError as exc:
            return _invalid(_fail_jupyter, exc)
        lang = self.config.languages.get(JUPYTER_IMAGE_LANGUAGE)
        if lang is None:
            return web.json_response(_fail_jupyter("run_jupyter needs the python language, not served here"))
        try:
            self._check_timeouts("run_jupyter", total_timeout=req.total_timeout)
            if req.cell_timeout < 0:
                raise SpecError("run_jupyter.cell_timeout", f"must be >= 0 (0: none), got {req.cell_timeout!r}")
            files = decode_files(req.files, "run_jupyter")
        except SpecError as exc:
            return web.json_response(_fail_jupyter(str(exc)))
        answer = await self._in_sandbox(lang.image, req.memory_limit_MB, req.total_timeout, "sandbox-fusion-jupyter",
                                        lambda sb: execute_jupyter(sb, req, files), _fail_jupyter)
        return web.json_response(answer)

    def _check_timeouts(self, where: str, **timeouts: float) -> None:
        for name, value in timeouts.items():
            check_number(f"{where}.{name}", value, lo=0, hi=self.config.max_timeout_s, lo_open=True)

    async def _in_sandbox(self, image: str, memory_limit_mb: int, budget_s: float, name: str,
                          work: Callable[[Sandbox], Awaitable[RunCodeResponse | RunJupyterResponse]],
                          fail: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
        """``work`` in a fresh sandbox once admitted; every failure as ``fail``'s answer.
        The answer goes out as soon as ``work`` has it: the sandbox is destroyed after
        (a container's removal is most of a short request's time), its slot held until then."""
        verdict = await self.admission.acquire(self.config.queue_timeout_s)
        if verdict is not Admit.OK:
            return fail(self._refusal(verdict))
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._lifecycle(image, memory_limit_mb, budget_s, name, work, fail, answer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await asyncio.shield(answer)

    async def _lifecycle(self, image: str, memory_limit_mb: int, budget_s: float, name: str,
                         work: Callable[[Sandbox], Awaitable[RunCodeResponse | RunJupyterResponse]],
                         fail: Callable[[str], dict[str, Any]], answer: asyncio.Future[dict[str, Any]]) -> None:
        limit = self.config.setup_timeout_s + budget_s

        def give(body: dict[str, Any]) -> None:
            if not answer.done():
                answer.set_result(body)
        try:
            async with timers.timeout(limit):
                spec = sandbox_spec(self.pool, image, memory_limit_mb)
                async with self.pool.sandbox(spec, tenant=self.config.tenant, name=name) as sb:
                    give((await work(sb)).to_json())
        except TimeoutError:
            give(fail(f"no answer within {limit:g} s (sandbox start and file transfers included); "
                      "the sandbox was destroyed"))
        except FlowMeshError as exc:
            log.info("sandbox-fusion %s: %s: %s", name, type(exc).__name__, exc)
            give(fail(f"{type(exc).__name__}: {exc}"))
        except Exception as exc:   # noqa: BLE001 - answered, never a 500 (and logged)
            log.exception("sandbox-fusion %s: unexpected error", name)
            give(fail(f"internal error: {type(exc).__name__}: {exc}"))
        finally:
            self.admission.release()
            give(fail("cancelled: the server is shutting down"))

    def _refusal(self, verdict: Admit) -> str:
        st = self.admission.stats()
        if verdict is Admit.OVERLOADED:
            return (f"overloaded: {st.running} requests running on the pool's {st.slots} slots and {st.queued} "
                    f"queued (queue_size {st.queue_size}); retry later")
        if verdict is Admit.TIMED_OUT:
            return f"overloaded: no free slot within queue_timeout_s={self.config.queue_timeout_s:g} s; retry later"
        return "the server is shutting down"
