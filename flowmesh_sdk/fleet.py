"""The fleet: the entry point of the SDK.  It owns the event bus, the metadata store,
the control backend, the image resolver and the providers, and makes pools.

    async with Fleet() as fleet:
        pool = await fleet.pool(PoolSpec(name="eval", mode="persistent", ...))
        async with pool.sandbox(image="localhost/flowmesh/swe-base:bookworm") as sb:
            print((await sb.exec("pytest -x")).exit_code)
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import collector, gc, settings
from .catalog.loader import Catalog
from .config import Owner, home_dir, new_run_id
from .control.backend import ControlBackend
from .control.events import Event, EventBus, EventKind
from .control.limits import QuotaLimits
from .control.shared import Adoption, SharedInstance
from .control.spend import SpendLedger, SpendSummary
from .control.state import open_backend
from .control.store import MetadataStore
from .errors import FlowMeshError, PoolClosedError, SpecError, ThrottledError
from .images import (DefaultResolver, ImageResolver, LocalStoreResolver, PullBudget, PullPolicy,
                     RegistryResolver)
from .bidder.demand import ModelSpec
from .placement import Placement, place, providers_named
from .placement.ranking import PriceBook
from .pools.auto import AutoPool
from .pools.base import MachinePool, Pool, PoolContext
from .pools.bootstrap import BootstrapPolicy
from .pools.ephemeral import EphemeralPool
from .pools.machines import ReconcileResult
from .pools.persistent import PersistentPool
from .pools.warm_pods import WarmPodPool
from .provider import TAG_FLEET, Provider, available_providers, load_provider
from .provisioning import Failover, Provisioner, RetryPolicy
from .registry.auth import Credentials, env_credentials, write_auth_file
from .registry.client import RegistryClient
from .remote.local import LocalRunner
from .remote.runner import Runner
from .remote.runtime import ContainerRuntime, RuntimeConfig
from .specs import InstanceSpec, Offer, Policy, PoolMode, PoolSpec, check_name, check_number
from .workers.elastic import ElasticWorkers
from .workers.elastic_records import ScalingPolicy, ServeCommand
from .workers.specs import ClientLimits

if TYPE_CHECKING:
    from .observe.metrics import FleetMetrics
    from .reuse import ResultReuse
    from .specs import Task, TaskResult

log = logging.getLogger("flowmesh.fleet")


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    terminated: tuple[str, ...]       # orphans of this fleet, terminated and confirmed
    still_present: tuple[str, ...]    # asked to terminate, still listed
    forgotten: tuple[str, ...]        # store records closed: the provider no longer lists them


class Fleet:
    """Pools of sandboxes on one or more providers, coordinated by this process.

    ``catalog`` prices every offer (default: the shipped snapshot, or the newer cache that
    ``flowmesh catalog refresh`` writes); ``budget_per_hour`` / ``budget_total`` bound the
    whole fleet's spend as each pool's own budgets bound the pool's; a reconciler compares
    each pool's instances with what the providers list every ``reconcile_interval_s``
    (None: only when :meth:`reconcile_pools` is called).

    ``providers`` maps names to ready provider objects; any other name is loaded from
    the ``flowmesh_sdk.providers`` entry points with ``provider_options[name]``.
    ``quotas`` sets per-tenant limits (``"*"`` is the default for every tenant).
    ``state`` picks where the control state lives: ``"redis://host:port/db"`` shares quotas,
    permits, rate limits, budgets and the fleet's instances with every coordinator on that
    Redis (the ``[redis]`` extra; see docs/operations.md); default ``FLOWMESH_STATE``, else
    this process.
    Images: ``localhost/...`` come from this host's store; any other reference is resolved
    in its registry (credentials from ``registry_credentials`` or the podman/docker auth
    files) within ``pull_policy``'s per-registry budget.  ``bootstrap`` says how far bringing
    a machine up may go (installing a runtime where missing; see :mod:`.pools.bootstrap`).
    ``metrics_port`` serves the fleet's Prometheus metrics on ``127.0.0.1:PORT/metrics``
    (0: any free port, see ``fleet.metrics.port``; the ``[metrics]`` extra;
    :mod:`.observe.metrics`).
    ``run`` names this run of the fleet (default: a fresh id, ``fleet.run``): every
    instance, container, event, store row and result carries it, and ``flowmesh gc --run``
    reaps what one run left behind.
    """

    def __init__(self, name: str = "default", *, home: str | Path | None = None,
                 providers: Mapping[str, Provider] | None = None,
                 provider_options: Mapping[str, Mapping[str, Any]] | None = None,
                 control: ControlBackend | None = None, state: str | None = None,
                 images: ImageResolver | None = None,
                 runtime_config: RuntimeConfig | None = None,
                 quotas: Mapping[str, QuotaLimits] | None = None,
                 registry_credentials: Mapping[str, Credentials] | None = None,
                 pull_policy: PullPolicy | None = None,
                 retry_policy: RetryPolicy | None = None,
                 bootstrap: BootstrapPolicy | None = None,
                 bootstrap_timeout_s: float = 600.0,
                 catalog: Catalog | None = None,
                 budget_per_hour: float | None = None, budget_total: float | None = None,
                 reconcile_interval_s: float | None = 60.0,
                 metrics_port: int | None = None, run: str | None = None) -> None:
        check_name("fleet.name", name)
        if run is not None:
            check_name("fleet.run", run)
        if control is not None and control.fleet not in (None, name):
            raise SpecError("fleet.control", f"the control backend keeps fleet {control.fleet!r}'s state, not "
                                             f"{name!r}'s: make it for this fleet (RedisBackend(url, fleet={name!r}))")
        for field, value in (("fleet.budget_per_hour", budget_per_hour), ("fleet.budget_total", budget_total)):
            if value is not None:
                check_number(field, value, lo=0, lo_open=True)
        if reconcile_interval_s is not None:
            check_number("fleet.reconcile_interval_s", reconcile_interval_s, lo=0, lo_open=True)
        if metrics_port is not None:
            check_number("fleet.metrics_port", metrics_port, lo=0, hi=65535, integer=True)
        if catalog is not None and not isinstance(catalog, Catalog):
            raise SpecError("fleet.catalog", f"must be a Catalog, got {type(catalog).__name__}")
        self._catalog = catalog
        gc_setting = settings.resolve(collector.SETTING)
        self._gc_threshold = collector.parse(str(gc_setting.value), gc_setting.source)
        self._gc_held = False
        self.budget_per_hour = budget_per_hour
        self.budget_total = budget_total
        self.reconcile_interval_s = reconcile_interval_s
        self._reconciler: asyncio.Future[None] | None = None
        self.name = name
        self.run_id = run or new_run_id()
        self.home = Path(home) if home else home_dir()
        self.home.mkdir(parents=True, exist_ok=True)
        self.owner = str(Owner.current())
        self.bus = EventBus(run=self.run_id)
        self.store = MetadataStore(self.home / "flowmesh.db")
        self.store.attach(self.bus)
        # the control state: in this process, or shared with other coordinators (Redis)
        self._own_control = control is None
        self.control = control or open_backend(state, fleet=name)
        self._control_started = False
        self.ledger: SpendLedger = self.control.ledger(name)
        self.control.on_adopted(self._adopted)
        self._reclaims: set[asyncio.Task[gc.GcResult]] = set()
        self.runtime_config = runtime_config
        self._providers: dict[str, Provider] = dict(providers or {})
        self._owned: set[str] = set()   # loaded here, so closed here (the caller closes its own)
        self._provider_options = {k: dict(v) for k, v in (provider_options or {}).items()}
        # one runtime per runner while anything (an instance) holds it: a runtime holds its
        # runner, so a live entry's id is never another runner's (issue 29: not one per
        # instance ever launched, kept for the fleet's life)
        self._runtimes: weakref.WeakValueDictionary[int, ContainerRuntime] = weakref.WeakValueDictionary()
        self._local_runner = LocalRunner()
        self._registry_creds = dict(registry_credentials or {})
        self._authfiles: dict[str, str | None] = {}
        self.pulls = PullBudget(self.control, pull_policy, on_retry=self._pull_retry)
        self.provisioner = Provisioner(self.control, retry_policy, on_failover=self._failover)
        self.registry = RegistryClient(credentials=self._registry_creds)
        self.images = images or DefaultResolver(
            LocalStoreResolver(self.runtime_for(self._local_runner)),
            RegistryResolver(self.registry, self.pulls))
        quotas = dict(quotas or {})
        self.quota = self.control.quota(f"fleet:{name}:tenants", quotas.pop("*", None))
        for tenant, limits in quotas.items():
            self.quota.set(tenant, limits)
        self.bootstrap_timeout_s = bootstrap_timeout_s
        self.bootstrap = bootstrap or BootstrapPolicy()
        self.pools: dict[str, Pool] = {}
        self.elastic_roles: dict[str, ElasticWorkers] = {}   # made by elastic()
        self._closed = False
        self._results: ResultReuse | None = None   # behind .results, made on first use
        self.provisioner.on_retry = self._provider_retry
        self.metrics: FleetMetrics | None = None
        if metrics_port is not None:
            from .observe import metrics
            self.metrics = metrics.FleetMetrics(bus=self.bus, ledger=self.ledger, pools=self.pools)
            try:
                self.metrics.serve(int(metrics_port))
            except FlowMeshError:   # a port in use: no fleet, so nothing of it left open
                self.store.close()
                raise

    def __repr__(self) -> str:
        return f"Fleet({self.name!r}, run={self.run_id!r}, pools={sorted(self.pools)})"

    def _pull_retry(self, what: str, attempt: int, exc: BaseException, wait_s: float) -> None:
        self.bus.publish(Event(EventKind.IMAGE_PULL_RETRY, fleet=self.name,
                               detail=f"{what}: attempt {attempt} failed ({exc}); retry in {wait_s:.1f} s"))

    def _provider_retry(self, provider: str, region: str, api: str, exc: BaseException, wait_s: float) -> None:
        reason = "throttled" if isinstance(exc, ThrottledError) else "unavailable"
        self.bus.publish(Event(EventKind.PROVIDER_RETRY, fleet=self.name, detail=json.dumps(
            {"provider": provider, "region": region, "api": api, "reason": reason, "wait_s": round(wait_s, 3)})))

    def _failover(self, f: Failover, nxt: Offer | None) -> None:
        where = f"{nxt.provider}/{nxt.region}/{nxt.instance_type}" if nxt else "none left"
        self.bus.publish(Event(EventKind.LAUNCH_FAILOVER, fleet=self.name, pool=f.pool,
                               detail=f"{f.offer.provider}/{f.offer.region}/{f.offer.instance_type}"
                                      f"{' spot' if f.offer.spot else ''} {f.reason}: {f.error} -> "
                                      f"{where} ({f.price_delta:+.4f} $/h)"))

    def authfile_for(self, registry: str) -> str | None:
        """A 0600 auth file for a registry whose credentials came from ``registry_credentials``
        or the environment (podman reads the default auth files by itself)."""
        if registry in self._authfiles:
            return self._authfiles[registry]
        creds = self._registry_creds.get(registry) or env_credentials(registry)
        if creds is None:
            self._authfiles[registry] = None   # asked once per registry, not once per pull
            return None
        if registry not in self._authfiles:
            d = self.home / "auth"
            d.mkdir(mode=0o700, exist_ok=True)
            safe = "".join(c if c.isalnum() else "_" for c in registry)
            self._authfiles[registry] = str(write_auth_file(d / f"{safe}.json", registry, creds))
        return self._authfiles[registry]

    def provider(self, name: str) -> Provider:
        if name not in self._providers:
            opts = dict(self._provider_options.get(name, {}))
            if name == "local":
                opts.setdefault("runtime_config", self.runtime_config)
                opts.setdefault("state_dir", self.home / "local" / "instances")
            self._providers[name] = load_provider(name, **opts)
            self._owned.add(name)
        return self._providers[name]

    def runtime_for(self, runner: Runner) -> ContainerRuntime:
        """One runtime (and one probe) per runner."""
        rt = self._runtimes.get(id(runner))
        if rt is None:
            rt = self._runtimes[id(runner)] = ContainerRuntime(runner, self.runtime_config)
        return rt

    async def start(self) -> Fleet:
        """Connect the control state (with ``state="redis://..."`` or ``FLOWMESH_STATE``: join
        the shared fleet; a Redis that cannot be reached is a ControlPlaneUnavailableError
        naming the URL).  ``async with`` and the first pool call it.  A closed fleet is not
        opened again (a PoolClosedError): its store and providers are closed, and what it
        launched would have no owner left to reap it."""
        if self._closed:
            raise PoolClosedError(f"fleet {self.name} is closed: it makes no pool or role; open a new Fleet")
        if not self._gc_held:
            collector.hold(self._gc_threshold)
            self._gc_held = True
        if not self._control_started:
            await self.control.start()
            self.control.attach(self.name, self.bus)
            self._control_started = True
        return self

    async def pool(self, spec: PoolSpec | None = None, **kwargs: Any) -> Pool:
        """Create (and start) a pool; ``kwargs`` are PoolSpec fields when no spec is given.

        The pool's offers are gathered from every provider of its search space
        (``spec.infra``), priced from the catalog and ranked by the bidder
        (:mod:`flowmesh_sdk.placement`); bad entries, providers that cannot serve the
        pool and offers that fit nothing are a :class:`SpecError` before anything is
        launched."""
        if spec is None:
            spec = PoolSpec(**kwargs)
        elif kwargs:
            raise SpecError("pool", "give a PoolSpec or keyword fields, not both")
        await self.start()
        if spec.name in self.pools and not self.pools[spec.name].closed:
            raise SpecError("pool.name", f"a pool named {spec.name!r} already exists in this fleet")
        providers, placement = await self._placement(spec)
        ctx = PoolContext(fleet=self.name, owner=self.owner, bus=self.bus, images=self.images,
                          quota=self.quota, control=self.control, pulls=self.pulls,
                          provisioner=self.provisioner,
                          authfile_for=self.authfile_for, runtime_for=self.runtime_for,
                          bootstrap_timeout_s=self.bootstrap_timeout_s, bootstrap=self.bootstrap,
                          spend=self.ledger, fleet_budget_per_hour=self.budget_per_hour,
                          fleet_budget_total=self.budget_total, run=self.run_id)
        kinds: dict[PoolMode, type[MachinePool | AutoPool]] = {
            PoolMode.PERSISTENT: PersistentPool, PoolMode.EPHEMERAL: EphemeralPool, PoolMode.AUTO: AutoPool}
        cls = kinds[spec.mode]
        if cls is PersistentPool and not any(p.capabilities.nested_containers for p in providers.values()):
            cls = WarmPodPool   # its instances are containers: warm pods, not warm machines
        pool = cls(ctx, spec, providers, placement)
        self.pools[spec.name] = pool
        try:
            await pool.start()
        except BaseException:
            await pool.drain(timeout_s=0)
            self.pools.pop(spec.name, None)
            raise
        self._start_reconciler()
        return pool

    async def elastic(self, providers: Sequence[str], spec: InstanceSpec, model: ModelSpec, engine: ServeCommand,
                      *, role: str = "inference", scaling: ScalingPolicy | None = None, weights: Policy | None = None,
                      resident: Sequence[str] = (), limits: ClientLimits | None = None,
                      book: PriceBook | None = None) -> ElasticWorkers:
        """An elastic GPU role (:class:`~flowmesh_sdk.workers.ElasticWorkers`) made by this
        fleet, on the named providers (loaded as :meth:`pool` loads them): it launches and
        terminates through the fleet's provisioner, is charged to the fleet's ledger under
        ``role`` (in :meth:`spend`, ``flowmesh status`` and the metrics), rents only what the
        fleet's budgets allow, publishes on its bus, is reconciled with the fleet's pools
        (:meth:`reconcile_pools`) and is closed with the fleet.  Not
        started: ``await role.start()`` (or ``async with``)."""
        check_name("elastic.role", role)
        if role in self.pools or (role in self.elastic_roles and not self.elastic_roles[role].closed):
            raise SpecError("elastic.role", f"{role!r} already names a pool or a role of this fleet")
        if isinstance(providers, str) or not providers:
            raise SpecError("elastic.providers", "must be a non-empty list of provider names")
        await self.start()
        workers = ElasticWorkers({n: self.provider(n) for n in providers}, spec, model, engine, role=role,
                                 scaling=scaling, weights=weights, resident=resident, limits=limits, book=book,
                                 fleet=self.name, owner=self.owner, bus=self.bus, control=self.control,
                                 provisioner=self.provisioner, ledger=self.ledger,
                                 budget_per_hour=self.budget_per_hour, budget_total=self.budget_total)
        self.elastic_roles[role] = workers
        self._start_reconciler()
        return workers

    async def _placement(self, spec: PoolSpec) -> tuple[dict[str, Provider], Placement]:
        """The providers of ``spec``'s search space (loaded by name on first use) and its
        ranked offers (:func:`flowmesh_sdk.placement.place`)."""
        installed = set(available_providers()) | set(self._providers)
        names = providers_named(spec.search_space, installed, field=spec.infra_field)
        providers = {n: self.provider(n) for n in names}
        return await place(spec, providers, lambda: self.catalog)

    @property
    def catalog(self) -> Catalog:
        """The price catalog every offer is priced from: the shipped snapshot or the newer
        ``flowmesh catalog refresh`` cache, unless one was given."""
        if self._catalog is None:
            self._catalog = Catalog.load(warn=False)
        return self._catalog

    # ---- reconciling -----------------------------------------------------------------
    def _start_reconciler(self) -> None:
        if self._reconciler is None and self.reconcile_interval_s:
            self._reconciler = asyncio.ensure_future(self._reconcile_loop())

    async def _reconcile_loop(self) -> None:
        """Every ``reconcile_interval_s``: each pool's instances against what their
        providers list (batched describes under the rate limits)."""
        assert self.reconcile_interval_s
        while not self._closed:
            await asyncio.sleep(self.reconcile_interval_s)
            await self.reconcile_pools()

    async def reconcile_pools(self) -> dict[str, ReconcileResult]:
        """Reconcile every open pool and elastic role now (what the background reconciler
        does on its deadline): instances a provider no longer lists are given up and
        replaced (up to ``min_instances``; a role's lost workers replaced by its loop);
        terminations that failed are retried."""
        out: dict[str, ReconcileResult] = {}
        parts: list[tuple[str, Pool | ElasticWorkers]] = [*self.pools.items(), *self.elastic_roles.items()]
        for name, part in parts:
            if part.closed:
                continue
            try:
                out[name] = await part.reconcile()
            except FlowMeshError as exc:
                log.warning("pool %s: reconcile failed: %s", name, exc)
        return out

    def spend(self) -> SpendSummary:
        """What the fleet's instances cost so far, and its burn rate now."""
        return self.ledger.summary()

    # ---- result reuse (flowmesh_sdk.reuse) ------------------------------------------
    @property
    def results(self) -> ResultReuse:
        """The fleet's :class:`~flowmesh_sdk.reuse.ResultReuse`: by default over a local
        content-addressable store in ``FLOWMESH_HOME/cas``, resolving images with this
        fleet's resolver and publishing its events on ``fleet.bus``.  Assign another (e.g.
        over an ``S3Store``) before the first use to share results between machines."""
        if self._results is None:
            from .cas.local import LocalDirStore
            from .reuse import ResultReuse

            self._results = ResultReuse(LocalDirStore(self.home / "cas"), resolver=self.images,
                                        bus=self.bus, fleet=self.name)
        return self._results

    @results.setter
    def results(self, reuse: ResultReuse) -> None:
        self._results = reuse

    async def run(self, task: Task, *, pool: Pool | str, workflow: str | None = None,
                  cache_failures: bool | None = None) -> TaskResult:
        """Run ``task`` on ``pool`` (a pool or its name) through :attr:`results`: a stored
        result of the same work is returned without running, the same work in flight is
        joined.  Returns a TaskResult whose ``reuse`` and ``provenance`` say which."""
        if isinstance(pool, str):
            if pool not in self.pools:
                raise SpecError("pool", f"no pool named {pool!r} in this fleet; have "
                                        f"{', '.join(sorted(self.pools)) or 'none'}")
            target = self.pools[pool]
        else:
            target = pool
        return await self.results.run(task, target, workflow=workflow, cache_failures=cache_failures)

    async def reconcile(self, providers: Sequence[str] = ("local",)) -> ReconcileReport:
        """What the clouds say against what the store says, after a restart: instances of
        this fleet whose owner process is gone are terminated (confirmed by describe), and
        store records of instances the clouds no longer list are closed."""
        provs = [self.provider(name) for name in providers]
        shared = await self.control.shared_instances(self.name)
        plan = await gc.plan(provs, None, shared=shared)
        mine = tuple(o for o in plan.instances if o.fleet == self.name)
        result = await gc.execute(gc.GcPlan(mine, ()), provs, None, provisioner=self.provisioner)
        if shared is not None:
            done = set(result.terminated)
            await self.control.forget_instances([i for i in shared.instances if i.id in done])
        listed = {i.id for p in provs for i in await p.list_tagged({TAG_FLEET: self.name})}
        ours = {i for pool in self.pools.values() for i in pool.instances}
        rows = await asyncio.to_thread(self.store.instances, live_only=True)
        gone = [r.id for r in rows if r.fleet == self.name and r.id not in listed and r.id not in ours]
        for instance_id in gone:
            self.bus.publish(Event(EventKind.INSTANCE_TERMINATED, fleet=self.name, instance_id=instance_id,
                                   detail="reconciled: no longer listed by its provider"))
        return ReconcileReport(terminated=result.terminated, still_present=result.still_present,
                               forgotten=tuple(gone))

    # ---- a shared fleet: what a dead coordinator left -----------------------------------
    def _adopted(self, adoption: Adoption) -> None:
        mine = tuple(i for i in adoption.adopted if i.fleet == self.name)
        if mine and not self._closed:
            task = asyncio.ensure_future(self.reclaim(mine, dead=adoption.dead))
            self._reclaims.add(task)
            task.add_done_callback(self._reclaimed)

    def _reclaimed(self, task: asyncio.Task[gc.GcResult]) -> None:
        self._reclaims.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fleet %s: reclaiming a dead coordinator's instances failed: %s (they stay listed, "
                      "held by this coordinator; `flowmesh gc` takes them once it is gone)",
                      self.name, task.exception())

    async def reclaim(self, insts: Sequence[SharedInstance], *, dead: str) -> gc.GcResult:
        """Terminate instances of this fleet adopted from the dead coordinator ``dead`` (on a
        shared fleet the reaper calls this; the dead one's claimed tasks are back in their
        queues already): confirmed by describe, recorded on the bus (so in the store and
        the shared stream) and their charges ended.  An instance of a provider whose
        machines are slices of one host (``local``) is reclaimed only from that host and
        ``FLOWMESH_HOME``; elsewhere it is left listed, and a warning says where to run
        ``flowmesh gc``."""
        plan, provs = await gc.plan_adopted(insts, dead, self.provider)
        res = await gc.execute(plan, provs, None, provisioner=self.provisioner, record=self.bus.publish)
        for instance_id in res.terminated:
            self.ledger.end(instance_id)
        log.warning("fleet %s: reclaimed %d instance(s) of dead coordinator %s%s", self.name,
                    len(res.terminated), dead,
                    f"; still listed by their provider: {', '.join(res.still_present)}" if res.still_present else "")
        return res

    async def close(self, timeout_s: float | None = None) -> None:
        """Drain every pool, close providers and the store (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._reconciler is not None:
            self._reconciler.cancel()
            await asyncio.gather(self._reconciler, return_exceptions=True)
        if self._reclaims:   # a reclaim under way finishes (it is terminating instances)
            await asyncio.gather(*list(self._reclaims), return_exceptions=True)
        try:
            await asyncio.gather(*(r.aclose(timeout_s) for r in self.elastic_roles.values()),
                                 *(p.drain(timeout_s) for p in self.pools.values()))
        finally:
            if self._gc_held:
                collector.release()
                self._gc_held = False
            for name in self._owned:
                await self._providers[name].close()
            await self.registry.close()
            await self.store.flush()
            self.store.close()
            if self.metrics is not None:
                self.metrics.close()
            if self._own_control:
                await self.control.close()

    async def __aenter__(self) -> Fleet:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        # A block left with an exception (or cancelled) waits for nothing in flight: what
        # held it (a sandbox left open, a deployment never stopped, the caller's tasks) is
        # gone with the exception, and waiting for it would never end.
        await self.close(None if exc_type is None else 0)
