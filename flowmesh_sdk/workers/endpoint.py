"""The caller's side of an inference worker: an OpenAI-compatible endpoint with an async client.

:class:`InferenceEndpoint` holds the base URL and served model name of one worker and
sends ``/v1/completions`` and ``/v1/chat/completions`` requests (httpx) that

* pass a token bucket first (:class:`~flowmesh_sdk.control.limits.TokenBucket`, the first
  tier of the three-tier control): one token per call, waited for up to the call's
  deadline, else :class:`~flowmesh_sdk.errors.ThrottledError`;
* carry the worker's locality: ``X-FlowMesh-Worker`` (which worker), ``X-FlowMesh-Model``
  and ``X-FlowMesh-G-Loc: 1`` while the model is resident on it (G_loc is the locality
  term of the scheduler's utility); every :class:`Completion` carries the same values;
* are micro-batched when they are completions with the same model and sampling
  parameters (OpenAI's ``prompt`` may be a list; vLLM answers one choice per prompt,
  ``index = prompt * n + j``), up to ``max_batch`` prompts or ``max_batch_wait_s``.
  Chat requests are sent one by one: the chat API takes one conversation per request
  (vLLM still batches concurrent requests on the GPU by itself).

:meth:`drain` implements the "leave" half of FlowMesh's join/leave: stop admitting
(new calls raise :class:`~flowmesh_sdk.errors.PoolClosedError`), send the waiting
batches at once, wait for the calls in flight until a deadline, then fail the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from .. import clock
from ..control.limits import TokenBucket
from ..errors import (AuthError, NotFoundError, PoolClosedError, ProviderUnavailableError, SpecError,
                      ThrottledError)
from ..redaction import redact_url
from .batching import MicroBatcher, group_key
from .specs import ChatMessage, ClientLimits, SamplingParams

HEADER_WORKER = "X-FlowMesh-Worker"
HEADER_MODEL = "X-FlowMesh-Model"
HEADER_G_LOC = "X-FlowMesh-G-Loc"

V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Completion:
    """One caller's answer.  ``text`` is the first choice, ``choices`` all ``n`` of them;
    ``batch_size`` is how many callers shared the HTTP request; ``worker`` and ``g_loc``
    are the locality the request carried."""

    text: str
    choices: tuple[str, ...]
    finish_reason: str | None
    model: str
    worker: str
    g_loc: float
    batch_size: int


@dataclass(frozen=True, slots=True)
class DrainReport:
    """How a drain went: calls answered while draining, calls failed at the deadline."""

    completed: int
    abandoned: int
    waited_s: float


@dataclass(frozen=True, slots=True)
class _Prompt:
    prompt: str
    params: SamplingParams


class InferenceEndpoint:
    """An OpenAI-compatible endpoint served by one worker (vLLM, or any server that speaks
    the same API).  Usable on its own: ``InferenceEndpoint("http://10.0.0.5:8000", "m")``."""

    def __init__(self, base_url: str, model: str, *, worker: str = "", tensor_parallel: int | None = None,
                 limits: ClientLimits | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            shown = redact_url(base_url) if isinstance(base_url, str) else base_url
            raise SpecError("endpoint.base_url", f"must be an http(s) URL, got {shown!r}")
        if not isinstance(model, str) or not model:
            raise SpecError("endpoint.model", f"must be a non-empty string, got {model!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.worker = worker or self.base_url
        self.tensor_parallel = tensor_parallel
        self.limits = limits or ClientLimits()
        self.resident = True
        self.answered = 0
        self._client = httpx.AsyncClient(base_url=self.base_url, transport=transport,
                                         timeout=self.limits.request_timeout_s)
        self._bucket = TokenBucket(self.limits.rate_per_s, self.limits.burst, key=f"endpoint:{self.worker}")
        self._batcher: MicroBatcher[_Prompt, Completion] = MicroBatcher(
            self._send_completions, max_batch=self.limits.max_batch,
            max_wait_s=self.limits.max_batch_wait_s)
        self._admitting = True
        self._calls: set[asyncio.Future[Any]] = set()

    def __repr__(self) -> str:
        return (f"InferenceEndpoint({redact_url(self.base_url)!r}, model={self.model!r}, worker={self.worker!r}, "
                f"tp={self.tensor_parallel})")

    # ---- what a request carries -------------------------------------------------------
    @property
    def g_loc(self) -> float:
        """1.0 while the model is resident on the worker (it is loaded and serving)."""
        return 1.0 if self.resident else 0.0

    @property
    def admitting(self) -> bool:
        return self._admitting

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    @property
    def batch_sizes(self) -> list[int]:
        """The size of every completions batch sent so far."""
        return list(self._batcher.sizes)

    def _headers(self) -> dict[str, str]:
        return {HEADER_WORKER: self.worker, HEADER_MODEL: self.model, HEADER_G_LOC: f"{self.g_loc:g}"}

    # ---- public calls -----------------------------------------------------------------
    async def complete(self, prompt: str, params: SamplingParams | None = None, *,
                       timeout_s: float | None = None) -> Completion:
        """Complete ``prompt``; may share one request with other callers (same parameters)."""
        if not isinstance(prompt, str):
            raise SpecError("prompt", f"must be a string, got {type(prompt).__name__}")
        p = params or SamplingParams()
        key = group_key(self.model, p.payload())
        return await self._call(lambda: self._batcher.submit(key, _Prompt(prompt, p)), timeout_s)

    async def chat(self, messages: Sequence[ChatMessage], params: SamplingParams | None = None, *,
                   timeout_s: float | None = None) -> Completion:
        """Answer a conversation (``/v1/chat/completions``); not batched."""
        msgs = list(messages)
        if not msgs or not all(isinstance(m, ChatMessage) for m in msgs):
            raise SpecError("messages", "must be a non-empty list of ChatMessage")
        p = params or SamplingParams()
        return await self._call(lambda: self._send_chat(msgs, p), timeout_s)

    async def models(self) -> tuple[str, ...]:
        """The model names the server lists on ``/v1/models``."""
        r = await self._request("GET", "/v1/models", None)
        return tuple(str(m.get("id")) for m in r.get("data") or [] if isinstance(m, dict))

    # ---- admission, deadline, drain ------------------------------------------------------
    async def _call(self, start: Callable[[], Awaitable[V]], timeout_s: float | None) -> V:
        if not self._admitting:
            raise PoolClosedError(f"worker {self.worker} is draining and admits no new requests")
        deadline_s = timeout_s if timeout_s is not None else self.limits.request_timeout_s
        inner = asyncio.ensure_future(self._limited(start, deadline_s))
        self._calls.add(inner)
        inner.add_done_callback(self._call_done)
        try:
            return await inner
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # our own caller cancelled
            raise PoolClosedError(f"worker {self.worker} left before it answered "
                                  "(drain deadline passed)") from None

    async def _limited(self, start: Callable[[], Awaitable[V]], deadline_s: float) -> V:
        t0 = clock.monotonic()
        await self._bucket.acquire(1.0, timeout_s=deadline_s)
        left = deadline_s - (clock.monotonic() - t0)
        try:
            return await asyncio.wait_for(start(), max(left, 0.001))
        except asyncio.TimeoutError:
            raise ProviderUnavailableError(f"{self.worker} gave no answer within {deadline_s:g} s",
                                           provider="inference", code="Timeout") from None

    def _call_done(self, fut: asyncio.Future[Any]) -> None:
        self._calls.discard(fut)
        if not fut.cancelled() and fut.exception() is None:
            self.answered += 1

    async def drain(self, timeout_s: float) -> DrainReport:
        """Stop admitting, send waiting batches now, wait for calls in flight up to
        ``timeout_s``; the calls still running then fail with PoolClosedError."""
        t0 = clock.monotonic()
        self._admitting = False
        before = self.answered
        flush = asyncio.ensure_future(self._batcher.flush())
        calls = list(self._calls)   # nothing new is admitted from here on
        if calls:
            await asyncio.wait(calls, timeout=timeout_s)
        left = [c for c in calls if not c.done()]
        if left:   # the deadline passed: stop the batches on the wire and fail their callers
            self._batcher.cancel()
            for fut in left:
                fut.cancel()
        await asyncio.gather(flush, *left, return_exceptions=True)
        return DrainReport(completed=self.answered - before, abandoned=len(left),
                           waited_s=clock.monotonic() - t0)

    async def aclose(self) -> None:
        """Refuse new calls, cancel what is left and close the HTTP client."""
        self._admitting = False
        self.resident = False
        self._batcher.cancel()
        for fut in list(self._calls):
            fut.cancel()
        await self._client.aclose()

    async def __aenter__(self) -> InferenceEndpoint:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- HTTP ---------------------------------------------------------------------------
    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            r = await self._client.request(method, path, json=body, headers=self._headers())
        except httpx.TimeoutException as exc:
            raise ProviderUnavailableError(f"{self.worker}{path}: no answer ({type(exc).__name__})",
                                           provider="inference", code="Timeout") from exc
        except httpx.HTTPError as exc:
            raise ProviderUnavailableError(f"{self.worker}{path}: {type(exc).__name__}: {exc}",
                                           provider="inference", code="Unreachable") from exc
        if r.status_code >= 400:
            raise _http_error(self.worker, path, r)
        try:
            data = r.json()
        except ValueError as exc:
            raise ProviderUnavailableError(f"{self.worker}{path}: answer is not JSON",
                                           provider="inference", code="BadAnswer") from exc
        if not isinstance(data, dict):
            raise ProviderUnavailableError(f"{self.worker}{path}: answer is not a JSON object",
                                           provider="inference", code="BadAnswer")
        return data

    async def _send_completions(self, key: str, items: list[_Prompt]) -> list[Completion]:
        params = items[0].params
        body = {"model": self.model, "prompt": [i.prompt for i in items], **params.payload()}
        data = await self._request("POST", "/v1/completions", body)
        by_index = {int(c.get("index", -1)): c for c in data.get("choices") or [] if isinstance(c, dict)}
        n = params.n
        out: list[Completion] = []
        for i in range(len(items)):
            picked = [by_index.get(i * n + j) for j in range(n)]
            if any(c is None for c in picked):
                raise ProviderUnavailableError(
                    f"{self.worker}/v1/completions: {len(by_index)} choices for {len(items)} prompts x n={n}",
                    provider="inference", code="BadAnswer")
            texts = tuple(str(c.get("text", "")) for c in picked if c is not None)
            out.append(Completion(texts[0], texts, picked[0].get("finish_reason") if picked[0] else None,
                                  self.model, self.worker, self.g_loc, len(items)))
        return out

    async def _send_chat(self, messages: list[ChatMessage], params: SamplingParams) -> Completion:
        body = {"model": self.model, "messages": [{"role": m.role, "content": m.content} for m in messages],
                **params.payload()}
        data = await self._request("POST", "/v1/chat/completions", body)
        choices = sorted((c for c in data.get("choices") or [] if isinstance(c, dict)),
                         key=lambda c: int(c.get("index", 0)))
        if not choices:
            raise ProviderUnavailableError(f"{self.worker}/v1/chat/completions: no choices",
                                           provider="inference", code="BadAnswer")
        texts = tuple(str((c.get("message") or {}).get("content") or "") for c in choices)
        return Completion(texts[0], texts, choices[0].get("finish_reason"), self.model, self.worker,
                          self.g_loc, 1)


def _http_error(worker: str, path: str, r: httpx.Response) -> Exception:
    """Map an HTTP error answer to the SDK's error classes."""
    try:
        body = r.json()
        err = body.get("error", body) if isinstance(body, dict) else {}
        detail = str(err.get("message") if isinstance(err, dict) else err)[:400]
    except ValueError:
        detail = r.text[:400]
    msg = f"{worker}{path} answered {r.status_code}: {detail}"
    if r.status_code == 429:
        after = r.headers.get("retry-after") or ""
        wait = float(after) if after.replace(".", "", 1).isdigit() else None
        return ThrottledError(msg, provider="inference", code="HTTP429", retry_after_s=wait)
    if r.status_code in (401, 403):
        return AuthError(msg, provider="inference", code=f"HTTP{r.status_code}")
    if r.status_code == 404:
        return NotFoundError(msg, provider="inference", code="HTTP404")
    if r.status_code in (400, 422):
        return SpecError("request", msg)
    return ProviderUnavailableError(msg, provider="inference", code=f"HTTP{r.status_code}")
