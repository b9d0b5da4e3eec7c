"""OpenTelemetry spans of a task's journey and of provider calls (opentelemetry-api).

Without a tracer provider (no OpenTelemetry SDK configured) every span here is the API's
non-recording span: nothing is exported and almost nothing is done.  With one, each task
a pool runs is a trace::

    flowmesh.task                     pool, task name, tenant, task id; H_task (a Task run by
    ├── flowmesh.admission            run_task, once its image digest is known), exit code
    ├── flowmesh.placement
    │   ├── flowmesh.provider.launch  provider, region, api  (a launch this task caused)
    │   ├── flowmesh.bootstrap        instance
    │   └── flowmesh.image.pull       image, instance
    ├── flowmesh.env_startup          (a sandbox made on the instance; an ephemeral pool's
    │                                  launch, bootstrap and pull nest here)
    ├── flowmesh.exec
    └── flowmesh.teardown

The phase spans are cut at the same marks as :class:`~flowmesh_sdk.specs.PhaseTimings`
(admission = queued plus the dispatch checks).  Configure a provider as usual, e.g.
``trace.set_tracer_provider(TracerProvider())`` with an exporter of your choice.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context

    from ..specs import Task

P = ParamSpec("P")
R = TypeVar("R")

TRACER_NAME = "flowmesh"
#: the mark that starts each phase span, and the phase span it starts
_PHASE_AT = {"submitted": "admission", "admitted": "placement", "placed": "env_startup",
             "started": "exec", "finished": "teardown"}


def tracer() -> trace.Tracer:
    """The SDK's tracer, from the global provider (a no-op one until you set yours)."""
    return trace.get_tracer(TRACER_NAME)


def configured() -> bool:
    """Whether a tracer provider was set (until then the API hands out its proxy, whose
    spans record nothing): the hot paths skip making spans without one."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Span]:
    """A span around a block, child of the current one; ``None`` attributes are left out;
    an exception escaping the block is recorded on it."""
    if not configured():
        yield trace.INVALID_SPAN
        return
    attrs = {f"flowmesh.{k}": v for k, v in attributes.items() if v is not None}
    with tracer().start_as_current_span(name, attributes=attrs) as s:
        yield s


def traced(name: str, attrs: Callable[..., dict[str, Any]] | None = None
           ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate an async function (or method) to run in a span; ``attrs(*args, **kw)``
    gives its attributes."""
    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def inner(*args: P.args, **kwargs: P.kwargs) -> R:
            if not configured():
                return await fn(*args, **kwargs)
            with span(name, **(attrs(*args, **kwargs) if attrs else {})):
                return await fn(*args, **kwargs)
        return inner
    return wrap


class Journey:
    """The spans of one task run through a pool, driven by the run's phase marks
    (``TaskRun.mark``).  Each phase span is made current, so the spans of work done
    for the task (a launch, a bootstrap, a pull) nest under the phase they happened in."""

    __slots__ = ("root", "phase", "task", "_token", "_ctx")

    def __init__(self, pool: str, task_id: str, name: str, tenant: str) -> None:
        self.task: Task | None = None
        self.root = tracer().start_span("flowmesh.task", attributes={
            "flowmesh.pool": pool, "flowmesh.task.id": task_id, "flowmesh.task.name": name,
            "flowmesh.tenant": tenant})
        self.phase: Span | None = None
        self._ctx = trace.set_span_in_context(self.root)
        self._token: Token[Context] | None = None

    @property
    def recording(self) -> bool:
        return self.root.is_recording()

    def mark(self, what: str, run: Any) -> None:
        """``run`` reached mark ``what`` (a :class:`~flowmesh_sdk.pools.base.TaskRun`)."""
        if not self.root.is_recording():
            return
        if self.phase is not None:
            self.phase.end()
            self.phase = None
        if what == "started":
            self._identity(run)
        if what == "torn_down":
            self._end(run)
            return
        phase = _PHASE_AT.get(what)
        if phase is None:      # "checked": inside admission
            return
        self.phase = tracer().start_span(f"flowmesh.{phase}", context=self._ctx)
        token = otel_context.attach(trace.set_span_in_context(self.phase, self._ctx))
        if self._token is None:
            self._token = token     # the context before the task: restored at the end

    def _identity(self, run: Any) -> None:
        self.root.set_attribute("flowmesh.instance", run.instance_id or "")
        if self.task is None or not run.image_digest:
            return
        from ..errors import SpecError
        from ..identity import task_identity
        try:
            self.root.set_attribute("flowmesh.h_task", task_identity(self.task, run.image_digest).h_task)
        except SpecError:       # an image id that is not a digest: no identity to show
            pass

    def _end(self, run: Any) -> None:
        if run.result is not None:
            self.root.set_attribute("flowmesh.exit_code", run.result.exit_code)
        if run.error:
            self.root.set_status(Status(StatusCode.ERROR, run.error[:200]))
        self.root.end()
        if self._token is not None:
            try:
                otel_context.detach(self._token)
            except ValueError:     # marked from another context (a re-dispatch): nothing to restore
                pass
            self._token = None


def journey(pool: str, task_id: str, name: str, tenant: str) -> Journey | None:
    """A :class:`Journey` when a recording tracer is configured, else None (no cost)."""
    if not configured():
        return None
    j = Journey(pool, task_id, name, tenant)
    return j if j.recording else None


def _provider_call_attrs(*args: Any) -> dict[str, Any]:
    _self, provider, region, api = args
    return {"provider": getattr(provider, "name", str(provider)), "region": region, "api": api}


def provider_call(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``Provisioner.call(provider, region, api, fn)`` in a ``flowmesh.provider.<api>`` span."""
    @functools.wraps(fn)
    async def inner(*args: P.args, **kwargs: P.kwargs) -> R:
        if not configured():
            return await fn(*args, **kwargs)
        attrs = _provider_call_attrs(*args[:4])
        with span(f"flowmesh.provider.{attrs['api']}", **attrs):
            return await fn(*args, **kwargs)
    return inner
