"""The records of the elastic GPU workers (:mod:`.elastic`): the scaling policy, how a
worker's engine is started, the rent-to-ready lag, scaling decisions and statistics, and
one worker as the loop manages it."""

from __future__ import annotations

import asyncio
import json
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..bidder.demand import MARKET_CHOICES
from ..errors import SpecError
from ..lifecycle import Lifecycle
from ..placement.ranking import Candidate
from ..provider import Instance
from ..remote.runner import Runner
from ..specs import check_number
from .endpoint import InferenceEndpoint
from .errors import WorkerStartError
from .state import WorkerState

@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How the fleet of one role follows its queue.

    ``min_workers`` / ``max_workers``: bounds; ``target_queue_per_worker``: the backlog
    (requests waiting plus in flight) one worker should carry -- the loop wants
    ``ceil(backlog / target)`` workers; ``scale_down_idle_s``: a worker idle that long may
    be drained and released; ``cooldown_s``: the least time between two scaling actions
    (replacing a lost worker does not wait); ``interval_s``: the control tick (reconcile
    with the provider, then scale); ``worker_concurrency``: requests one worker holds in
    flight at once; ``drain_timeout_s``: how long a leaving worker may finish what it
    holds (what is left is re-dispatched); ``ready_timeout_s``: rent to ready, at most;
    ``market``: ``on-demand``, ``spot`` (interruptible: Vast.ai bids) or ``any`` (ranked
    together by U); ``max_redispatch``: how often one request may be handed to another
    worker before it fails."""

    min_workers: int = 0
    max_workers: int = 4
    target_queue_per_worker: float = 8.0
    scale_down_idle_s: float = 60.0
    cooldown_s: float = 30.0
    interval_s: float = 5.0
    worker_concurrency: int = 16
    drain_timeout_s: float = 60.0
    ready_timeout_s: float = 900.0
    market: str = "on-demand"
    max_redispatch: int = 3

    def __post_init__(self) -> None:
        check_number("scaling.min_workers", self.min_workers, lo=0, hi=10_000, integer=True)
        check_number("scaling.max_workers", self.max_workers, lo=1, hi=10_000, integer=True)
        if self.min_workers > self.max_workers:
            raise SpecError("scaling.min_workers", f"must be <= max_workers ({self.max_workers}), "
                                                   f"got {self.min_workers}")
        check_number("scaling.target_queue_per_worker", self.target_queue_per_worker, lo=0, lo_open=True)
        for name in ("scale_down_idle_s", "cooldown_s", "drain_timeout_s"):
            check_number(f"scaling.{name}", getattr(self, name), lo=0, hi=30 * 86400)
        check_number("scaling.interval_s", self.interval_s, lo=0, hi=3600, lo_open=True)
        check_number("scaling.ready_timeout_s", self.ready_timeout_s, lo=0, hi=86400, lo_open=True)
        check_number("scaling.worker_concurrency", self.worker_concurrency, lo=1, hi=100_000, integer=True)
        check_number("scaling.max_redispatch", self.max_redispatch, lo=0, hi=100, integer=True)
        if self.market not in MARKET_CHOICES:
            raise SpecError("scaling.market", f"must be one of {', '.join(MARKET_CHOICES)}; got {self.market!r}")

    def desired(self, backlog: int) -> int:
        """Workers wanted for ``backlog`` requests (waiting plus in flight)."""
        want = math.ceil(backlog / self.target_queue_per_worker - 1e-9) if backlog > 0 else 0
        return max(self.min_workers, min(self.max_workers, want))


@dataclass(frozen=True, slots=True)
class ServeCommand:
    """How the engine starts on a rented instance, as the instance's own process.

    ``argv`` may name ``{model}``, ``{host}`` and ``{port}``; it runs under ``nohup``
    with its output in ``log_path`` (``{name}``: the worker's name), and its pid is kept
    to stop it.  ``model``: the name ``/v1/models`` must list (vLLM's
    ``--served-model-name``); ``port``: where it listens; ``bind_host``: what ``{host}``
    becomes (None: the address clients use); ``url_of``: the base URL clients use for an
    instance and its runner (None: ``http://<the runner's SSH host>:<port>``, else the
    instance's address)."""

    argv: tuple[str, ...]
    model: str
    port: int = 8000
    bind_host: str | None = "0.0.0.0"
    log_path: str = "/tmp/flowmesh-engine-{name}.log"
    url_of: Callable[[Instance, Runner], str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.argv, (str, bytes)) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise SpecError("engine.argv", f"must be a non-empty tuple of strings, got {self.argv!r}")
        object.__setattr__(self, "argv", tuple(self.argv))
        if not isinstance(self.model, str) or not self.model:
            raise SpecError("engine.model", f"must be the served model name, got {self.model!r}")
        check_number("engine.port", self.port, lo=1, hi=65535, integer=True)

    @classmethod
    def vllm(cls, model: str, *, port: int = 8000, extra_args: Sequence[str] = (), **kw: object) -> ServeCommand:
        """``vllm serve MODEL --host {host} --port {port} ...``."""
        return cls(("vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}", *extra_args),
                   model=model, port=port, **kw)  # type: ignore[arg-type]  # kw: the other fields, checked on init

    def host_of(self, instance: Instance, runner: Runner) -> str:
        target = getattr(runner, "target", None)
        host = getattr(target, "host", None) or instance.address
        if not host:
            raise WorkerStartError(f"instance {instance.id}: no address to reach the engine at "
                                   "(give ServeCommand(url_of=...))")
        return str(host)

    def base_url(self, instance: Instance, runner: Runner) -> str:
        if self.url_of is not None:
            return self.url_of(instance, runner).rstrip("/")
        return f"http://{self.host_of(instance, runner)}:{self.port}"

    def shell(self, instance: Instance, runner: Runner, name: str) -> str:
        host = self.bind_host or self.host_of(instance, runner)
        argv = [a.format(model=self.model, host=host, port=self.port) for a in self.argv]
        log_path = self.log_path.format(name=name)
        return f"nohup {shlex.join(argv)} > {shlex.quote(log_path)} 2>&1 < /dev/null & echo $!"


@dataclass(frozen=True, slots=True)
class WorkerLag:
    """Rent to ready, in its parts (seconds): ``rent_s`` the launch call (failover
    included), ``boot_s`` until the instance ran a command, ``load_s`` from starting the
    engine until it was healthy (weights loaded), ``total_s`` all of it."""

    rent_s: float
    boot_s: float
    load_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class ScalingDecision:
    """One scaling action as published (``WORKERS_SCALED``): ``action`` ``up``, ``down``
    or ``replace``; ``count`` workers; the ``backlog`` and ``workers`` (live, starting
    included) it saw, the ``desired`` count, the ``reason``, and for a rental the ranked
    ``candidates`` it chose from (best U first)."""

    action: str
    count: int
    backlog: int
    workers: int
    desired: int
    reason: str
    candidates: tuple[Candidate, ...] = ()

    def to_json(self, limit: int = 5) -> str:
        return json.dumps({"action": self.action, "count": self.count, "backlog": self.backlog,
                           "workers": self.workers, "desired": self.desired, "reason": self.reason,
                           "candidates": [{"offer": c.offer.key, "offer_id": c.offer.offer_id, **c.terms}
                                          for c in self.candidates[:limit]]}, sort_keys=True)


@dataclass(frozen=True, slots=True)
class ElasticStats:
    """Counts of one loop so far: requests ``waiting`` and ``in_flight`` now; workers
    ``ready`` and ``starting`` now; ``rented``, ``released`` and ``lost`` (outbid or
    gone) in all; requests ``answered`` and ``redispatched``; the ``lags`` of every
    worker that became ready."""

    waiting: int
    in_flight: int
    ready: int
    starting: int
    rented: int
    released: int
    lost: int
    answered: int
    redispatched: int
    lags: tuple[WorkerLag, ...]


@dataclass(eq=False, slots=True)
class ElasticWorker:
    """One worker of the loop: its rented ``instance`` and the ``candidate`` (offer and U
    terms) it was rented from, its ``lifecycle`` (``state``), its ``endpoint`` once READY,
    the ``lag`` rent-to-ready, ``replaces`` (the lost worker it stands in for) and how
    many requests are ``assigned`` to it now."""

    name: str
    candidate: Candidate
    lifecycle: Lifecycle
    requested_at: float
    replaces: str | None = None
    instance: Instance | None = None
    endpoint: InferenceEndpoint | None = None
    lag: WorkerLag | None = None
    pid: int | None = None
    assigned: int = 0
    failures: int = 0
    idle_since: float = 0.0
    lost_reason: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def state(self) -> WorkerState:
        return self.lifecycle.state

    @property
    def offer_id(self) -> str | None:
        return self.candidate.offer.offer_id
