"""Prometheus metrics of one fleet, fed from its event bus (extra ``[metrics]``:
prometheus-client).

``Fleet(metrics_port=9464)`` serves them on ``http://127.0.0.1:9464/metrics``; or
``FleetMetrics(fleet).serve(port)`` for an existing fleet (or ``FleetMetrics(bus=...,
ledger=..., pools=...)`` for the parts of one); ``flowmesh serve-metrics``
serves what the metadata store of a ``FLOWMESH_HOME`` says (another process's fleet).

Every metric is named ``flowmesh_*`` with its unit as a suffix (``_seconds``, ``_bytes``,
``_usd``; counters end in ``_total``).  Labels are bounded: ``pool`` (the pools you
create), ``provider``, ``state``, ``outcome``, ``phase``, ``reason``, ``step``, ``api``,
``kind`` -- never a task, instance or request id.  docs/operations.md lists them with a
scrape config.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..control.events import TASK_END, Event, EventBus, EventKind
from ..errors import SpecError

if TYPE_CHECKING:
    from ..control.spend import SpendLedger
    from ..control.store import MetadataStore

log = logging.getLogger("flowmesh.observe.metrics")

PHASES = ("queued", "scheduling", "env_startup", "execution", "teardown")
#: seconds: a warm exec (ms) up to an hour-long task
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                   600.0, 1800.0, 3600.0)
FAILOVER_REASONS = ("capacity", "quota", "quota (skipped)", "throttled", "auth", "auth (skipped)", "unavailable")
#: instance.<state> events; the state label is the part after the dot (as the store records it)
_INSTANCE_KINDS = frozenset(k for k in EventKind if k.value.startswith("instance."))
_REUSE = {EventKind.REUSE_HIT: "hit", EventKind.REUSE_JOINED: "joined", EventKind.REUSE_EXECUTED: "executed"}
_PULL = re.compile(r"\(image size (\d+) bytes\) in ([0-9.]+) s")


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise SpecError("metrics", "needs prometheus-client: pip install 'flowmesh-sdk[metrics]'") from exc
    return prometheus_client


def _core() -> Any:
    _client()
    import prometheus_client.core
    return prometheus_client.core


def failover_labels(detail: str) -> tuple[str, str]:
    """(provider, reason) of a ``launch.failover`` detail
    (``PROVIDER/REGION/TYPE[ spot] REASON: error -> next``); reason ``other`` if unknown."""
    head, _, rest = detail.partition(" ")
    provider = head.split("/", 1)[0] or "unknown"
    rest = rest.removeprefix("spot ")
    reason = rest.split(":", 1)[0].strip()
    return provider, reason if reason in FAILOVER_REASONS else "other"


class MetricsSource(Protocol):
    """What :class:`FleetMetrics` reads of a fleet (a :class:`~flowmesh_sdk.fleet.Fleet` is one)."""

    @property
    def bus(self) -> EventBus: ...

    @property
    def ledger(self) -> SpendLedger: ...

    @property
    def pools(self) -> Iterable[str]: ...   # the names of its pools (a mapping by name is one)


class FleetMetrics:
    """Counters, histograms and gauges of one fleet, in their own registry.

    Fed from ``fleet``'s event bus, or from ``bus`` (with ``ledger`` and ``pools``, the
    names of the pools made before these metrics, given apart).  ``observe(event)`` is the
    bus handler (called on the event loop, quick); spend and burn rate are read from the
    fleet's :class:`SpendLedger` at each scrape."""

    def __init__(self, fleet: MetricsSource | None = None, *, bus: EventBus | None = None,
                 ledger: SpendLedger | None = None, pools: Iterable[str] = ()) -> None:
        pc = _client()
        self.registry = pc.CollectorRegistry(auto_describe=True)
        r = self.registry
        self._ledger = ledger if ledger is not None else (fleet.ledger if fleet is not None else None)
        self.events = pc.Counter("flowmesh_events", "Events published on the fleet's bus, by kind",
                                 ["kind"], registry=r)
        self.tasks = pc.Counter("flowmesh_tasks", "Tasks that ended, by outcome", ["pool", "outcome"], registry=r)
        self.phase = pc.Histogram("flowmesh_task_phase_seconds", "Seconds a task spent in each phase",
                                  ["pool", "phase"], buckets=LATENCY_BUCKETS, registry=r)
        self.transitions = pc.Counter("flowmesh_instance_transitions",
                                      "Instance lifecycle transitions, by the state entered",
                                      ["pool", "provider", "state"], registry=r)
        self.launches = pc.Counter("flowmesh_launches", "Instances launched (launch calls accepted)",
                                   ["pool", "provider"], registry=r)
        self.failovers = pc.Counter("flowmesh_launch_failovers", "Offers given up on, by reason",
                                    ["pool", "provider", "reason"], registry=r)
        self.refusals = pc.Counter("flowmesh_launch_refusals", "Launches a budget refused",
                                   ["pool", "budget"], registry=r)
        self.retries = pc.Counter("flowmesh_provider_retries", "Provider calls retried (throttled or unavailable)",
                                  ["provider", "api", "reason"], registry=r)
        self.pulls = pc.Counter("flowmesh_image_pulls", "Images pulled onto an instance", ["pool"], registry=r)
        self.pull_bytes = pc.Counter("flowmesh_image_pull_bytes", "Bytes of the images pulled", ["pool"],
                                     registry=r)
        self.pull_seconds = pc.Histogram("flowmesh_image_pull_seconds", "Seconds an image pull took", ["pool"],
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.pull_retries = pc.Counter("flowmesh_image_pull_retries", "Registry requests retried", registry=r)
        self.reuse = pc.Counter("flowmesh_reuse", "Result-reuse requests, by outcome (hit, joined, executed)",
                                ["outcome"], registry=r)
        self.reuse_saved = pc.Counter("flowmesh_reuse_saved_seconds", "Compute seconds reuse hits and joins saved",
                                      registry=r)
        self.bootstrap = pc.Histogram("flowmesh_bootstrap_step_seconds", "Seconds of each bootstrap step",
                                      ["step"], buckets=LATENCY_BUCKETS, registry=r)
        self._instances: dict[str, tuple[str, str, str]] = {}   # id -> (pool, provider, state), live only
        self._pools: set[str] = set(pools) | (set(fleet.pools) if fleet is not None else set())   # made before us
        r.register(_LiveCollector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        source = bus if bus is not None else (fleet.bus if fleet is not None else None)
        if source is not None:
            source.on(self.observe)

    # ---- feeding ------------------------------------------------------------------
    def observe(self, ev: Event) -> None:
        self.events.labels(ev.kind.value).inc()
        if ev.pool:
            self._pools.add(ev.pool)
        if ev.kind in TASK_END:
            self.tasks.labels(ev.pool, ev.kind.value.removeprefix("task.")).inc()
            if ev.phases is not None:
                for name in PHASES:
                    self.phase.labels(ev.pool, name).observe(getattr(ev.phases, name))
        elif ev.kind in _INSTANCE_KINDS:
            self._instance(ev)
        elif ev.kind is EventKind.LAUNCH_FAILOVER:
            provider, reason = failover_labels(ev.detail)
            self.failovers.labels(ev.pool, provider, reason).inc()
        elif ev.kind is EventKind.LAUNCH_REFUSED:
            self.refusals.labels(ev.pool, str(_json(ev.detail).get("which", "unknown"))).inc()
        elif ev.kind is EventKind.PROVIDER_RETRY:
            d = _json(ev.detail)
            self.retries.labels(str(d.get("provider", "")), str(d.get("api", "")), str(d.get("reason", ""))).inc()
        elif ev.kind is EventKind.IMAGE_PULLED:
            self.pulls.labels(ev.pool).inc()
            m = _PULL.search(ev.detail)
            if m:
                self.pull_bytes.labels(ev.pool).inc(int(m.group(1)))
                self.pull_seconds.labels(ev.pool).observe(float(m.group(2)))
        elif ev.kind is EventKind.IMAGE_PULL_RETRY:
            self.pull_retries.inc()
        elif ev.kind in _REUSE:
            self.reuse.labels(_REUSE[ev.kind]).inc()
            if ev.kind is not EventKind.REUSE_EXECUTED:
                self.reuse_saved.inc(float(_json(ev.detail).get("saved_s") or 0.0))

    def _instance(self, ev: Event) -> None:
        state = ev.kind.value.removeprefix("instance.")
        iid = ev.instance_id or ""
        pool, provider, _ = self._instances.get(iid, (ev.pool, "", ""))
        if ev.kind is EventKind.INSTANCE_REQUESTED:
            provider = str(_json(ev.detail).get("provider", "")) or provider
            self.launches.labels(pool, provider or "unknown").inc()
        if ev.kind is EventKind.INSTANCE_READY and ev.bootstrap is not None:
            for step in ev.bootstrap.steps:
                self.bootstrap.labels(step.name).observe(step.seconds)
        self.transitions.labels(pool, provider or "unknown", state).inc()
        if state == "terminated":
            self._instances.pop(iid, None)
        else:
            self._instances[iid] = (pool, provider or "unknown", state)

    # ---- reading ------------------------------------------------------------------
    def instances_by_state(self) -> dict[tuple[str, str, str], int]:
        out: dict[tuple[str, str, str], int] = {}
        for key in list(self._instances.values()):
            out[key] = out.get(key, 0) + 1
        return out

    def spend(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(pool, provider) -> ($ spent, burn $/h), from the ledger."""
        if self._ledger is None:
            return {}
        for _ in range(3):   # read from the scrape thread while the loop may add a charge
            try:
                return {(pool, prov): (s.spent, s.burn_per_hour)
                        for pool in sorted(self._pools) for prov, s in self._ledger.by_provider(pool).items()}
            except RuntimeError:
                continue
        return {}

    def exposition(self) -> bytes:
        """The text format a scrape gets."""
        return bytes(_client().generate_latest(self.registry))

    # ---- serving ------------------------------------------------------------------
    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns the port (0: any free one)."""
        if self._server is not None:
            raise SpecError("metrics_port", "this fleet's metrics are already served")
        self._server, self._thread = listen(self.registry, port, addr, field="metrics_port")
        return int(self._server.server_port)

    @property
    def port(self) -> int | None:
        return None if self._server is None else int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _LiveCollector:
    """What is true now, computed at scrape time: live instances by state, spend, burn."""

    def __init__(self, m: FleetMetrics) -> None:
        self.m = m

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        core = _core()
        inst = core.GaugeMetricFamily("flowmesh_instances", "Instances not terminated, by state",
                                      labels=["pool", "provider", "state"])
        for (pool, provider, state), n in sorted(self.m.instances_by_state().items()):
            inst.add_metric([pool, provider, state], n)
        yield inst
        yield from spend_families(self.m.spend())


def spend_families(spend: dict[tuple[str, str], tuple[float, float]]) -> Iterator[Any]:
    core = _core()
    spent = core.CounterMetricFamily("flowmesh_spend_usd", "USD spent so far (launch to confirmed termination)",
                                     labels=["pool", "provider"])
    burn = core.GaugeMetricFamily("flowmesh_burn_rate_usd_per_hour", "USD per hour of the instances live now",
                                  labels=["pool", "provider"])
    for (pool, provider), (s, b) in sorted(spend.items()):
        spent.add_metric([pool, provider], s)
        burn.add_metric([pool, provider], b)
    yield spent
    yield burn


class StoreCollector:
    """The metadata store of a ``FLOWMESH_HOME`` as metrics (``flowmesh serve-metrics``):
    tasks by state, instances not terminated by state, mean phase seconds, spend and burn
    per pool and provider, read at each scrape."""

    def __init__(self, open_store: Callable[[], MetadataStore]) -> None:
        self.open_store = open_store

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        core = _core()
        store = self.open_store()
        try:
            tasks = store.tasks(limit=10_000_000)
            insts = store.instances(live_only=True)
            spend = store.spend()
        finally:
            store.close()
        by_state: dict[tuple[str, str, str], int] = {}
        phase_sum: dict[tuple[str, str, str], float] = {}
        for t in tasks:
            key = (t.fleet, t.pool, t.state)
            by_state[key] = by_state.get(key, 0) + 1
            for name in PHASES:
                v = getattr(t, f"{name}_s")
                if v is not None:
                    k = (t.fleet, t.pool, name)
                    phase_sum[k] = phase_sum.get(k, 0.0) + v
        fam = core.GaugeMetricFamily("flowmesh_store_tasks", "Tasks in the metadata store, by state",
                                     labels=["fleet", "pool", "state"])
        for k, n in sorted(by_state.items()):
            fam.add_metric(list(k), n)
        yield fam
        ph = core.CounterMetricFamily("flowmesh_store_task_phase_seconds", "Seconds tasks spent in each phase",
                                      labels=["fleet", "pool", "phase"])
        for k, v in sorted(phase_sum.items()):
            ph.add_metric(list(k), v)
        yield ph
        inst = core.GaugeMetricFamily("flowmesh_store_instances", "Instances not terminated, by state",
                                      labels=["fleet", "pool", "state"])
        counts: dict[tuple[str, str, str], int] = {}
        for i in insts:
            counts[(i.fleet, i.pool, i.state)] = counts.get((i.fleet, i.pool, i.state), 0) + 1
        for k, n in sorted(counts.items()):
            inst.add_metric(list(k), n)
        yield inst
        spent = core.CounterMetricFamily("flowmesh_store_spend_usd", "USD spent (metadata store)",
                                         labels=["fleet", "pool", "provider"])
        burn = core.GaugeMetricFamily("flowmesh_store_burn_rate_usd_per_hour", "USD per hour of live instances",
                                      labels=["fleet", "pool", "provider"])
        for r in spend:
            spent.add_metric([r.fleet, r.pool, r.provider], r.spent)
            burn.add_metric([r.fleet, r.pool, r.provider], r.burn_per_hour)
        yield spent
        yield burn


def listen(registry: Any, port: int, addr: str, *, field: str) -> tuple[Any, threading.Thread]:
    """Serve ``registry`` on ``addr:port`` in a daemon thread (prometheus_client's server);
    a port in use or an address that is not this machine's is a :class:`SpecError` on ``field``."""
    try:
        return _client().start_http_server(port, addr=addr, registry=registry)
    except (OSError, OverflowError) as exc:   # gaierror is an OSError; OverflowError: a port past 65535
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpecError(field, f"cannot serve metrics on {addr}:{port}: {why}") from exc


def store_registry(open_store: Callable[[], MetadataStore]) -> Any:
    pc = _client()
    reg = pc.CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(open_store))
    return reg


def _json(text: str) -> dict[str, Any]:
    try:
        out = json.loads(text) if text.startswith("{") else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}
