"""The provider contract: what every cloud (and this host) offers the core.

A provider only talks to its cloud.  Six calls, all async and batched:

``offers(spec)``        the purchasable shapes that fit ``spec`` (may be empty).
``launch(request)``     start ``request.count`` instances of one offer in ONE cloud call,
                        tagged at creation with ``request.tags``.  Idempotent by
                        ``request.request_id``: calling again with the same id returns the
                        instances of the first call instead of launching more.
``describe(ids)``       current view of those instances.  Eventually consistent: an id the
                        cloud does not know (yet, or any more) is omitted, never an error.
``terminate(ids)``      batched; terminating an unknown or already-gone id is not an error.
``list_tagged(tags)``   every live instance carrying all of ``tags`` (an empty mapping:
                        every instance carrying ``flowmesh:fleet``).  This is how ``gc`` and a
                        restarted coordinator find what a crash left behind.
``runner(instance)``    a :class:`~flowmesh_sdk.remote.runner.Runner` that runs commands on it.

Instances that are containers (``nested_containers=False``: a Vast.ai instance, a
Kubernetes pod) are the sandbox itself: an ephemeral pool's launch carries the task's
image and sandbox spec (:attr:`LaunchRequest.container`), the instance runs that image,
its runner's commands run inside it, and no container runtime is nested in it
(:mod:`flowmesh_sdk.remote.direct`).  Such a provider says why an instance ended before it
ran in :attr:`Instance.fault` (an image its machine could not pull, no room to schedule
it, a machine lost), so the pool raises the right error at once instead of waiting.

Optional: ``leftovers()`` / ``remove_leftovers(scan)`` for what a provider finds outside its
instances (:class:`Leftover`): containers ``terminate`` could not remove because their machine
did not answer (``ssh``), which ``flowmesh gc`` sweeps once it answers again; a crashed
coordinator's agent-sandbox warm pools (``k8s``).  The provider lists and removes; gc decides.

What callers may assume: instance ids are the cloud's unique ids (never names a user could
reuse), unique per provider and never reused, not even after termination; a
launched instance is findable by its tags from the moment ``launch`` returns; errors are
the SDK's (:class:`CapacityError`, :class:`QuotaError`, :class:`ThrottledError`,
:class:`AuthError`, :class:`NotFoundError`) with the cloud's error chained as cause.
Capabilities are declared in :attr:`Provider.capabilities`, never discovered by catching
``NotImplementedError``, and the core reads them: ``max_batch`` and ``rates`` plan launch
calls, ``tags`` says how the SDK's tags are carried on the cloud (a provider encodes with
it before a launch or a filter and decodes what it lists), ``nested_containers=False``
refuses a persistent sandbox pool on instances that are themselves containers, ``free``
prices the provider's offers at 0 (machines the user already has) instead of from the
catalog, and ``spot`` lets a pool's spot preference use the provider.

Prices: a cloud provider reports shapes, availability and capacity; ``Offer.price_per_hour``
is ``None`` and the fleet prices each offer from the catalog (one source of prices), and
an offer the catalog has no price for is excluded and said, never guessed.  Retries, rate limits and failover wrap this contract from
outside; a driver does not retry on its own.

Providers register a :class:`~flowmesh_sdk.descriptor.ProviderDescriptor` under the
entry-point group ``flowmesh_sdk.providers`` (:mod:`flowmesh_sdk.backends`); the core
loads them by name and never imports a cloud SDK itself.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from . import backends
from .descriptor import ApiRate, ProviderDescriptor, load_ref
from .errors import SpecError
from .remote.runner import Runner
from .specs import InstanceSpec, Offer, SandboxSpec
from .tags import PlainTags, TagCodec

ENTRY_POINT_GROUP = backends.GROUP
TAG_FLEET = "flowmesh:fleet"
TAG_POOL = "flowmesh:pool"
TAG_OWNER = "flowmesh:owner"
TAG_RUN = "flowmesh:run"       # the fleet's run id (Fleet(run=...)): what flowmesh gc --run reaps
TAG_REQUEST = "flowmesh:request"

# Labels on every sandbox container, so ``gc`` can find them on the machine itself.
LABEL_FLEET = "flowmesh.fleet"
LABEL_POOL = "flowmesh.pool"
LABEL_INSTANCE = "flowmesh.instance"
LABEL_OWNER = "flowmesh.owner"
LABEL_RUN = "flowmesh.run"
LABEL_TASK = "flowmesh.task"


@dataclass(frozen=True, slots=True)
class Capabilities:
    spot: bool = False
    gpus: bool = False
    stop_start: bool = False
    max_batch: int = 1            # most instances one launch call may ask for
    remote: bool = True           # False when instances are slices of this host
    rates: tuple[ApiRate, ...] = ()
    tags: TagCodec = field(default_factory=PlainTags)   # how the SDK's tags travel on the cloud
    nested_containers: bool = True   # False: instances are containers (Vast.ai, pods) -- the sandbox itself
    free: bool = False            # the machines cost the SDK nothing (this host, the user's own)


class ProviderState(str, enum.Enum):
    """What the cloud says of an instance (the SDK's own lifecycle is richer)."""

    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"           # where a cloud reports it: not running, not gone, still billed for disk
    TERMINATED = "terminated"


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What an instance that is a container runs (``nested_containers=False``): the task's
    image, pinned by digest (``ImageInfo.run_ref``), and its sandbox spec (limits, network,
    kernel, workdir, env).  ``stock``: how many instances of it a persistent pool keeps warm
    (:mod:`flowmesh_sdk.pools.warm_pods`; 0: a one-off), which a provider may use to keep a
    warm pool of its own behind them (``k8s``: agent-sandbox's SandboxWarmPool)."""

    image: str
    sandbox: SandboxSpec
    stock: int = 0

    @property
    def key(self) -> tuple[object, ...]:
        """Equal for requests any one instance could serve (the spec's env is unhashable)."""
        sb = self.sandbox
        return (self.image, sb.cpus, sb.memory_gb, sb.pids, sb.network, sb.workdir, sb.kernel,
                tuple(sorted(sb.env.items())))


class FaultKind(str, enum.Enum):
    IMAGE = "image"             # its machine could not pull the image (the kubelet's ErrImagePull)
    CAPACITY = "capacity"       # no room to run it (unschedulable past the provider's bound)
    LOST = "lost"               # evicted, preempted, its machine lost


@dataclass(frozen=True, slots=True)
class InstanceFault:
    """Why the provider ended (or will never run) an instance, in the provider's words."""

    kind: FaultKind
    message: str


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    offer: Offer
    spec: InstanceSpec
    count: int
    request_id: str
    tags: Mapping[str, str] = field(default_factory=dict)
    container: ContainerRequest | None = None   # set for providers whose instances are containers

    def __post_init__(self) -> None:
        if not isinstance(self.count, int) or self.count < 1:
            raise SpecError("launch.count", f"must be an integer >= 1, got {self.count!r}")
        object.__setattr__(self, "tags", MappingProxyType(dict(self.tags)))


@dataclass(frozen=True, slots=True)
class Instance:
    """A machine as the provider reports it."""

    id: str
    provider: str
    region: str
    instance_type: str
    spec: InstanceSpec
    state: ProviderState
    tags: Mapping[str, str]
    launched_at: float
    price_per_hour: float = 0.0
    address: str | None = None
    port: int | None = None       # where the instance's sshd listens (None: 22, or not over SSH)
    zone: str | None = None
    fault: InstanceFault | None = None   # why it ended or cannot run (see FaultKind)


@dataclass(frozen=True, slots=True)
class Leftover:
    """Something of the SDK's that a provider finds outside its instances, for ``flowmesh gc``:

    * ``kind="container"`` (``ssh``): a container ``terminate`` could not remove because its
      machine did not answer then; no ``owner`` (its instance is terminated already), removed
      once the machine answers again;
    * ``kind="SandboxWarmPool"`` (``k8s``): an agent-sandbox warm pool (and its template) a
      coordinator made and did not delete (it crashed); ``owner`` is its owner tag, and gc
      takes it by the rules it applies to instances (:mod:`flowmesh_sdk.gc`).

    ``machine``: where it is (a host's name, a ``context/namespace``); ``container_id`` and
    ``container_name``: its id and name there (a container's, a warm pool's uid and name);
    ``instance_id``: the terminated instance it belonged to ("" when none).  ``reason``: why
    gc takes it, set by :func:`flowmesh_sdk.gc.plan` (a provider leaves it empty)."""

    machine: str
    instance_id: str
    container_id: str
    container_name: str
    fleet: str = ""
    pool: str = ""
    kind: str = "container"
    owner: str = ""          # the flowmesh:owner tag ("" when none)
    run: str = ""            # the flowmesh:run tag ("" when none)
    age_s: float = 0.0       # since it was made (0 when unknown)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LeftoverScan:
    """What one provider found outside its instances (``found``), the machines (or namespaces)
    that could not be asked (``unreachable``: machine and why) and the terminated instances
    whose machine answered with nothing of them left (``settled``)."""

    provider: str
    found: tuple[Leftover, ...] = ()
    unreachable: tuple[tuple[str, str], ...] = ()
    settled: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.found or self.unreachable or self.settled)


class Provider(abc.ABC):
    name: ClassVar[str]
    # set on the class; a provider whose capabilities follow its options (``sim``'s cloud,
    # ``k8s`` priced or free) sets its own on the instance
    capabilities: Capabilities

    @abc.abstractmethod
    async def offers(self, spec: InstanceSpec) -> list[Offer]: ...

    @abc.abstractmethod
    async def launch(self, request: LaunchRequest) -> list[Instance]: ...

    @abc.abstractmethod
    async def describe(self, ids: Sequence[str]) -> list[Instance]: ...

    @abc.abstractmethod
    async def terminate(self, ids: Sequence[str]) -> None: ...

    @abc.abstractmethod
    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]: ...

    @abc.abstractmethod
    def runner(self, instance: Instance) -> Runner: ...

    def mark_unhealthy(self, instances: Sequence[Instance], reason: str) -> None:  # noqa: B027
        """The pool gave up on ``instances`` (bootstrap failed, or lost under a task).  A
        cloud hands out a fresh VM next time anyway; a provider that reuses machines
        should avoid these for a while."""
        return None

    async def leftovers(self, fleet: str | None = None) -> LeftoverScan:
        """What the SDK left outside this provider's instances (``fleet``: only that fleet's):
        containers ``terminate`` left on machines that did not answer then, a crashed
        coordinator's warm pools.  None for a cloud, whose terminate takes everything with the VM."""
        return LeftoverScan(self.name)

    async def remove_leftovers(self, scan: LeftoverScan) -> LeftoverScan:
        """Remove what ``scan`` (from :meth:`leftovers`) found; returns what is still there
        and the machines that did not answer (the rest is forgotten)."""
        return LeftoverScan(self.name)

    async def wait_changed(self, ids: Sequence[str], timeout_s: float) -> None:
        """Return once one of ``ids`` may have changed state, at most after ``timeout_s``.
        Clouds push nothing, so this sleeps; a provider that watches its instances (``k8s``)
        returns at the change, and the pool's next describe sees it at once."""
        await asyncio.sleep(timeout_s)

    async def close(self) -> None:  # noqa: B027 - optional
        return None


def available_providers() -> dict[str, ProviderDescriptor]:
    """``{name: descriptor}`` of every installed provider."""
    return dict(backends.descriptors())


def provider_class(name: str, field_name: str = "pool.provider") -> type[Provider]:
    """The :class:`Provider` class of provider ``name`` (or an alias)."""
    d = backends.descriptor(name, field_name)
    cls = load_ref(d.provider, field_name)
    if not (isinstance(cls, type) and issubclass(cls, Provider)):
        raise SpecError(field_name, f"provider {d.name!r}: {d.provider!r} does not name a Provider class")
    return cls


def load_provider(name: str, **options: Any) -> Provider:
    """Instantiate the provider registered as ``name`` with its options (options it does
    not take, or a required one missing, are a :class:`SpecError` naming them)."""
    cls = provider_class(name)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise SpecError(f"provider {name!r} options", f"{exc} (given: {', '.join(sorted(options)) or 'none'})") from exc
    return cls(**options)
