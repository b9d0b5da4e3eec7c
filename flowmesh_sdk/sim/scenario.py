"""One simulated run: a batch of tasks through the REAL fleet, pools, provisioner,
pull budget and control plane, on the ``sim`` provider (``flowmesh_providers.sim``, loaded through
its descriptor like every provider), on virtual time.

    result = run_scenario(cloud, Workload(tasks=2000, minutes=100, mode="ephemeral",
                                          instance_type="ecs.c8a.2xlarge"), seed=7)
    result.makespan_s, result.cost_usd, result.phases_p50, result.cpu_ms_per_task

Each task is ``sim-work SECONDS`` in a sandbox of its own image (SWE-style: one image
per task, ``image_gb`` each) or of one shared image.  The result also carries the
lower bound the simulated cloud imposes on the makespan (API rate limits, the boot
times drawn, the NIC and registry bandwidth, the work itself), so the control plane's
own overhead is ``makespan / lower_bound - 1``.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from flowmesh_sdk import clock
from flowmesh_sdk.control.events import TASK_END, Event, EventKind
from flowmesh_sdk.errors import ImageNotFoundError, SpecError
from flowmesh_sdk.fleet import Fleet
from flowmesh_sdk.images import ImageInfo, ImageResolver, LayerInfo, PullPolicy
from flowmesh_sdk.provider import Provider, provider_class
from flowmesh_sdk.specs import (SPOT_CHOICES, InstanceSpec, PhaseTimings, PoolMode, PoolSpec, SandboxSpec, Task,
                                TaskResult, check_choice, check_number)

from . import loop
from .cloud import GBIT, SimCloud, sim_catalog

REGISTRY = "registry.sim.invalid"   # never contacted: the simulated machines answer pulls
# The fleet's pull budget toward the simulated registry: an assumption, not a published
# quota (a managed registry that serves thousands of instances at once); the time a pull
# takes is the links' business (the sim provider's network.py).  See docs/cost-model.md.
SIM_PULL_POLICY = PullPolicy(rate_per_s=1000.0, burst=2000, max_concurrent_pulls=10_000)


@runtime_checkable
class SimulatedCloud(Protocol):
    """What a run reads of the ``sim`` provider besides the :class:`Provider` contract:
    how many VMs it launched and how long they took to boot, its API call counts, its bill."""

    @property
    def launched(self) -> int: ...

    def boot_times(self, since: float) -> list[float]: ...

    @property
    def calls(self) -> Mapping[str, int]: ...

    def cost(self) -> float: ...

    def stats(self) -> Mapping[str, int]: ...


def sim_provider(cloud: SimCloud, **options: Any) -> Provider:
    """A ``sim`` provider of ``cloud``, made through its descriptor (the core names no
    provider package); it is also a :class:`SimulatedCloud`."""
    prov = provider_class("sim", "sim.provider")(cloud, **options)   # type: ignore[call-arg]  # sim's own signature
    if not isinstance(prov, SimulatedCloud):
        raise SpecError("sim.provider", f"{type(prov).__name__} is not a simulated cloud's provider")
    return prov


@dataclass(frozen=True, slots=True)
class Workload:
    """A batch submitted at once: ``tasks`` of ``minutes`` each on ``instance_type``,
    one per instance (ephemeral) or ``tasks_per_instance`` packed (persistent)."""

    tasks: int
    minutes: float
    instance_type: str
    mode: str = "ephemeral"            # or "persistent"
    tasks_per_instance: int = 1
    sandbox_cpus: float = 1.0
    sandbox_memory_gb: float = 1.0
    image_gb: float = 0.75
    distinct_images: bool = True       # SWE-style: every task its own image
    spot: bool | str = False           # the pool's spot preference: never | prefer | only (True: prefer)
    prewarmed: bool = False            # persistent: instances up (and READY) before the clock starts
    disk_gb: int | None = None         # per instance; default: room for twice the images running at once

    def __post_init__(self) -> None:
        check_number("workload.tasks", self.tasks, lo=1, hi=1_000_000, integer=True)
        check_number("workload.minutes", self.minutes, lo=0, lo_open=True)
        check_choice("workload.mode", self.mode, ("ephemeral", "persistent"))
        check_number("workload.tasks_per_instance", self.tasks_per_instance, lo=1, integer=True)
        check_number("workload.image_gb", self.image_gb, lo=0)
        if isinstance(self.spot, bool):
            object.__setattr__(self, "spot", "prefer" if self.spot else "never")
        check_choice("workload.spot", self.spot, SPOT_CHOICES)
        if self.mode == "ephemeral" and self.tasks_per_instance != 1:
            raise SpecError("workload.tasks_per_instance", "ephemeral pools run one task per instance")

    @property
    def instances(self) -> int:
        return math.ceil(self.tasks / self.tasks_per_instance)


@dataclass(frozen=True, slots=True)
class SimResult:
    workload: Workload
    cloud: str
    seed: int
    succeeded: int
    failed: int
    makespan_s: float                 # first submission to last result (virtual)
    lower_bound_s: float              # what the simulated cloud allows at best
    cost_usd: float
    instances_launched: int
    interrupted: int
    redispatched: int
    failovers: int
    phases_p50: PhaseTimings
    phases_mean: PhaseTimings
    api_calls: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0                # coordinator CPU for the whole run (process time)
    peak_in_flight: int = 0           # most tasks started and not yet ended at once

    @property
    def overhead_pct(self) -> float:
        return 100.0 * (self.makespan_s / self.lower_bound_s - 1.0) if self.lower_bound_s else 0.0

    @property
    def cpu_ms_per_task(self) -> float:
        return 1000.0 * self.cpu_s / self.workload.tasks


class SimResolver(ImageResolver):
    """Images of the simulated registry, by name: ``sim/task-<i>`` and ``sim/base``."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes           # image name -> bytes
        # one ImageInfo per image for the whole run: a lookup of the simulated registry is
        # free, so unlike the real resolvers' TTL caches (images.RegistryResolver) it never refetches
        self._resolved: dict[str, ImageInfo] = {}

    @staticmethod
    def digest(name: str) -> str:
        return "sha256:" + hashlib.sha256(name.encode()).hexdigest()

    async def resolve(self, image: str, *, arch: str = "x86_64") -> ImageInfo:
        info = self._resolved.get(image)
        if info is not None:
            return info
        name = image.removeprefix(f"{REGISTRY}/")
        if name not in self.sizes:
            raise ImageNotFoundError(image, "not in the simulated registry")
        d = self.digest(name)
        info = self._resolved[image] = ImageInfo(image=image, digest=d,
                                                 run_ref=f"{REGISTRY}/{name.split(':')[0]}@{d}",
                                                 registry=REGISTRY, layers=(LayerInfo(d, self.sizes[name]),))
        return info


@contextlib.asynccontextmanager
async def sim_fleet(cloud: SimCloud, images: Mapping[str, int], *, home: str, seed: int = 0,
                    types: Sequence[str] | None = None, sticky_terminations: int | None = None,
                    **fleet_options: Any) -> AsyncIterator[tuple[Fleet, SimulatedCloud]]:
    """A real :class:`Fleet` on a ``sim`` provider of ``cloud`` (call it under the
    virtual-time loop, :func:`.loop.run`): ``images`` maps image names in the simulated
    registry (``sim/...``; sandboxes name them ``REGISTRY/sim/...``) to their bytes.
    The fleet prices offers from the cloud's own catalog (:meth:`SimCloud.catalog`);
    ``fleet_options`` go to :class:`Fleet` (``budget_per_hour``, ``reconcile_interval_s``, ...)."""
    async with sim_clouds_fleet((cloud,), images, home=home, seed=seed,
                                types={cloud.name: types} if types is not None else None,
                                sticky_terminations=sticky_terminations, **fleet_options) as (fleet, provs):
        yield fleet, provs[cloud.name]


@contextlib.asynccontextmanager
async def sim_clouds_fleet(clouds: Sequence[SimCloud], images: Mapping[str, int], *, home: str, seed: int = 0,
                           types: Mapping[str, Sequence[str]] | None = None,
                           sticky_terminations: int | None = None,
                           **fleet_options: Any) -> AsyncIterator[tuple[Fleet, dict[str, SimulatedCloud]]]:
    """A real :class:`Fleet` over several simulated clouds at once (one
    ``sim`` provider each, named by the cloud; a pool spans them with
    ``PoolSpec(infra=(...))``), priced from all their catalogs together.  Cloud ``i``
    draws from ``seed + i``; ``types`` limits a cloud's offers (by cloud name)."""
    names = [c.name for c in clouds]
    if not clouds or len(set(names)) != len(names):
        raise SpecError("sim.clouds", f"give one or more clouds with distinct names, got {names}")
    resolver = SimResolver(dict(images))
    sizes = {resolver.digest(n): size for n, size in images.items()}
    made: dict[str, Provider] = {}
    provs: dict[str, SimulatedCloud] = {}
    for i, c in enumerate(clouds):
        prov = sim_provider(c, images=sizes, seed=seed + i, types=(types or {}).get(c.name),
                            sticky_terminations=sticky_terminations)
        assert isinstance(prov, SimulatedCloud)   # sim_provider checked it; this narrows the type
        made[c.name], provs[c.name] = prov, prov
    options: dict[str, Any] = {"pull_policy": SIM_PULL_POLICY, "bootstrap_timeout_s": 24 * 3600.0,
                               "catalog": sim_catalog(*clouds), **fleet_options}
    async with Fleet("sim", home=home, providers=made, images=resolver, **options) as fleet:
        yield fleet, provs


def run_scenario(cloud: SimCloud, w: Workload, *, seed: int = 0,
                 instance_types: Sequence[str] | None = None) -> SimResult:
    """Play ``w`` out on ``cloud`` (deterministic for ``seed``); see the module doc.
    ``instance_types``: the types offered to the pool, cheapest first (default: only
    the workload's), so that a capacity error fails over to the next."""
    with tempfile.TemporaryDirectory(prefix="fm-sim-") as home:
        cpu0 = time.process_time()
        res = loop.run(_run(cloud, w, seed, home, tuple(instance_types or (w.instance_type,))))
        return replace(res, cpu_s=time.process_time() - cpu0)


async def _run(cloud: SimCloud, w: Workload, seed: int, home: str, types: tuple[str, ...]) -> SimResult:
    cloud.type(w.instance_type)   # a SpecError naming the types when unknown
    size = int(w.image_gb * 1e9)
    names = [f"sim/task-{i}:1" for i in range(w.tasks)] if w.distinct_images else ["sim/base:1"]
    t = cloud.type(w.instance_type)
    spec = PoolSpec(name="sim", provider=cloud.name, mode=PoolMode(w.mode),
                    # a disk that holds the images of the tasks running at once (and then some)
                    instance=InstanceSpec(cpus=t.cpus, memory_gb=t.memory_gb,
                                          disk_gb=w.disk_gb or max(100, math.ceil(2 * w.tasks_per_instance
                                                                                   * w.image_gb))),
                    max_instances=w.instances, min_instances=w.instances if w.prewarmed else 0,
                    sandboxes_per_instance=w.tasks_per_instance if w.mode == "persistent" else 1,
                    warm_per_image=0, idle_timeout_s=3600.0, retry_infra_failures=4, spot=str(w.spot))
    counts = {"redispatched": 0, "failovers": 0, "in_flight": 0, "peak_in_flight": 0}

    def started(_e: Event) -> None:
        counts["in_flight"] += 1
        counts["peak_in_flight"] = max(counts["peak_in_flight"], counts["in_flight"])

    def ended(_e: Event) -> None:   # a task that ends, or is lost and queued again
        counts["in_flight"] = max(0, counts["in_flight"] - 1)   # (one cancelled while queued never started)

    async with sim_fleet(cloud, {n: size for n in names}, home=home, seed=seed, types=types) as (fleet, prov):
        fleet.bus.on(lambda e: counts.__setitem__("redispatched", counts["redispatched"] + 1),
                     EventKind.TASK_REDISPATCHED)
        fleet.bus.on(ended, EventKind.TASK_REDISPATCHED, *(TASK_END - {EventKind.TASK_REJECTED}))
        fleet.bus.on(lambda e: counts.__setitem__("failovers", counts["failovers"] + 1),
                     EventKind.LAUNCH_FAILOVER)
        fleet.bus.on(started, EventKind.TASK_STARTED)
        pool = await fleet.pool(spec)
        t0 = clock.monotonic()
        work_s = w.minutes * 60.0
        tasks = [Task(name=f"t{i}", sandbox=SandboxSpec(image=f"{REGISTRY}/{names[i % len(names)]}",
                                                        cpus=min(w.sandbox_cpus, float(t.cpus)),
                                                        memory_gb=w.sandbox_memory_gb, timeout_s=work_s * 2),
                      command=f"sim-work {work_s:g}", timeout_s=work_s * 2)
                 for i in range(w.tasks)]
        results = await pool.map(tasks)
        makespan = clock.monotonic() - t0
        await pool.drain()
        cost = prov.cost()
    ok = [r for r in results if r.ok]
    lb = lower_bound(cloud, w, prov, t0)
    return SimResult(workload=w, cloud=cloud.name, seed=seed, succeeded=len(ok),
                     failed=len(results) - len(ok), makespan_s=makespan, lower_bound_s=lb,
                     cost_usd=cost, instances_launched=prov.launched,
                     interrupted=prov.stats()["interrupted"], redispatched=counts["redispatched"],
                     failovers=counts["failovers"], peak_in_flight=counts["peak_in_flight"],
                     phases_p50=_phases(results, statistics.median),
                     phases_mean=_phases(results, statistics.fmean), api_calls=dict(prov.calls))


def _phases(results: Sequence[TaskResult], agg: Callable[[Iterable[float]], float]) -> PhaseTimings:
    if not results:
        return PhaseTimings()
    return PhaseTimings(**{f: agg(getattr(r.phases, f) for r in results)
                           for f in ("queued", "scheduling", "env_startup", "execution", "teardown")})


def lower_bound(cloud: SimCloud, w: Workload, prov: SimulatedCloud, t0: float) -> float:
    """The shortest makespan the simulated cloud allows for ``w``, whatever the client does.

    Instances: the k-th (0-based) cannot be asked for before the per-instance launch
    bucket allows it, ``max(0, (k + 1 - burst) / refill)`` after the start (EC2's
    resource bucket; 0 without limits), and boots in the time the cloud drew for the k-th
    instance it launched (the draws come in launch order whoever launches, so any client
    meets the same ones).  Then the first image pull at NIC speed, a container start and
    the work.  Pulls together cannot beat the registry's egress.
    Prewarmed persistent instances start from ready.
    """
    t = cloud.type(w.instance_type)
    size = w.image_gb * 1e9
    pull_s = size / (t.nic_gbps * GBIT)
    after_boot = pull_s + cloud.container_start_s + w.minutes * 60.0
    if w.prewarmed:
        launch_part = 0.0
    else:
        burst, refill = math.inf, math.inf
        for rate in cloud.rates:
            if rate.api == "launch" and rate.per_instance:
                burst, refill = rate.burst, rate.rate_per_s
        boots = prov.boot_times(t0 - 1e-9)[:w.instances]
        launch_part = max((max(0.0, (k + 1 - burst) / refill) if refill != math.inf else 0.0) + b
                          for k, b in enumerate(boots)) if boots else 0.0
    bound = launch_part + after_boot
    if cloud.registry_egress_gbps:
        images = w.tasks if w.distinct_images else w.instances
        bound = max(bound, images * size / (cloud.registry_egress_gbps * GBIT)
                    + cloud.container_start_s + w.minutes * 60.0)
    return bound

