"""The simulated provider: the provider contract over a :class:`~.cloud.SimCloud`, on
virtual time, so that the real pools, provisioner and concurrency control run above it
unchanged.

* ``launch`` fails with ``CapacityError`` past a type's capacity (the provisioner then
  fails over to the next offer, as on a real cloud); each instance boots after a
  lognormal delay drawn from the seeded RNG and is ``pending`` until then.
* spot instances are interrupted at the cloud's Poisson rate: the machine dies under
  whatever runs on it and the instance reads ``terminated``.
* every call is counted (``calls``) and every instance's billed time is kept, so
  :meth:`cost` is what the run would have been charged (at the cloud's own prices for the
  market each instance was launched in).

Offers are shapes only (``price_per_hour=None``, on-demand): the fleet prices them from
the catalog (``Fleet(catalog=cloud.catalog())``, see :meth:`.cloud.SimCloud.catalog_rows`)
and adds the spot variants itself where the catalog has a spot price and the pool's
``spot`` preference allows them.  Instance ids are ``<cloud>-<n>``, never reused.

Switches for testing what a real cloud does behind the SDK's back:

* ``sticky_terminations=n`` (or the cloud's): each instance survives its first ``n``
  terminate calls (it stays listed, running and billed), so "terminate is retried until
  the provider no longer lists it" can be watched; :meth:`stick` sets it per instance.
* :meth:`preempt` removes an instance now (a spot reclaim, a host failure): the machine
  dies, the instance reads ``terminated`` and is no longer listed -- nothing tells the
  SDK, so only a describe (a task failing on it, or the reconciler) finds out.
* :meth:`stop` stops an instance (``ProviderState.STOPPED``: still listed, the machine
  gone, no longer billed for compute).

A terminated instance is listed (``terminated``) for :data:`FORGET_AFTER_S`, then forgotten
(describe no longer returns it), as EC2 does; its bill, whether it was interrupted and its
boot time are kept as figures (:meth:`cost`, :meth:`stats`, :meth:`boot_times`), so the
simulated cloud holds what is live plus the last hour, not every VM of a long run.
"""

from __future__ import annotations

import array
import asyncio
import collections
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowmesh_sdk import clock
from flowmesh_sdk.errors import CapacityError, SpecError
from flowmesh_sdk.provider import TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, Provider, ProviderState
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.sim.cloud import GBIT, SimCloud, SimInstanceType
from flowmesh_sdk.specs import InstanceSpec, Offer, check_number

from .machine import SimMachine
from .network import Link

# How long a terminated instance stays listed: "Recently terminated instances might appear in
# the returned results. This interval is usually less than one hour." (EC2 API reference,
# DescribeInstances: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html)
FORGET_AFTER_S = 3600.0


@dataclass(slots=True)
class SimVm:
    instance: Instance
    type: SimInstanceType
    spot: bool
    machine: SimMachine
    launched_at: float
    boots_at: float
    terminated_at: float | None = None
    interrupted: bool = False
    stopped_at: float | None = None     # stop(): compute billing ends here
    terminate_calls: int = 0
    sticky: int = 0                     # terminate calls this instance survives

    @property
    def gone(self) -> bool:
        return self.terminated_at is not None

    def billed_s(self, now: float, minimum: float) -> float:
        ends = [t for t in (self.terminated_at, self.stopped_at) if t is not None]
        end = min(ends) if ends else now
        return max(minimum, end - self.launched_at)


class SimProvider(Provider):
    capabilities = Capabilities()   # replaced per instance from the cloud's profile

    def __init__(self, cloud: SimCloud, *, images: Mapping[str, int], seed: int = 0,
                 types: Sequence[str] | None = None, sticky_terminations: int | None = None) -> None:
        """``types`` limits the offers to those instance types; ``sticky_terminations``
        overrides the cloud's (how many terminate calls each new instance survives).
        Whether a pool runs on spot is the pool's ``spot`` preference, not the provider's."""
        self.cloud = cloud
        self.offered = tuple(types) if types is not None else tuple(t.name for t in cloud.types)
        for name in self.offered:
            cloud.type(name)
        self.sticky_terminations = cloud.sticky_terminations if sticky_terminations is None \
            else sticky_terminations
        check_number("sim.sticky_terminations", self.sticky_terminations, lo=0, hi=1_000_000, integer=True)
        self.name = cloud.name  # type: ignore[misc]  # Provider.name is a ClassVar; a simulated one is its cloud's
        self.capabilities = Capabilities(spot=True, max_batch=cloud.max_batch, remote=True,
                                         rates=cloud.rates)
        self.rng = random.Random(seed)
        self.registry_sizes = dict(images)
        self.egress = Link(f"{cloud.name}:registry", cloud.registry_egress_gbps * GBIT) \
            if cloud.registry_egress_gbps else None
        self.vms: dict[str, SimVm] = {}   # the VMs the cloud lists: live, and terminated within FORGET_AFTER_S
        self._launched_at = array.array("d")   # every VM launched, in launch order: when ...
        self._boot_s = array.array("d")        # ... and how long it took to boot
        self._forgotten_usd = 0.0              # the bill of the VMs no longer listed
        self._forgotten = collections.Counter[str]()   # how many of those were interrupted, stopped
        self.calls: collections.Counter[str] = collections.Counter()
        self.live: collections.Counter[str] = collections.Counter()   # live VMs per type
        self._by_request: dict[str, list[str]] = {}
        self._seq = 0

    def __repr__(self) -> str:
        return f"SimProvider({self.cloud.name}/{self.cloud.region}, {self.launched} vms)"

    @property
    def launched(self) -> int:
        """How many VMs this cloud has launched (listed or not)."""
        return self._seq

    def boot_times(self, since: float) -> list[float]:
        """How long each VM launched at or after ``since`` took to boot, in launch order."""
        return [b for t, b in zip(self._launched_at, self._boot_s) if t >= since]

    # ---- the contract ----------------------------------------------------------------
    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        """The offered types that fit ``spec``, as on-demand shapes without a price."""
        self.calls["offers"] += 1
        out = []
        for name in dict.fromkeys(self.offered):
            t = self.cloud.type(name)
            o = Offer(provider=self.name, region=self.cloud.region, instance_type=t.name, cpus=t.cpus,
                      memory_gb=t.memory_gb, spot=False, source="simulated", price_per_hour=None)
            if o.fits(spec):
                out.append(o)
        return out

    def explain_misfit(self, spec: InstanceSpec) -> str:
        shapes = ", ".join(f"{t.name} ({t.cpus} vCPU, {t.memory_gb:g} GiB)"
                           for t in (self.cloud.type(n) for n in dict.fromkeys(self.offered)))
        return (f"no simulated {self.name} type has {spec.cpus} vCPUs, {spec.memory_gb:g} GiB"
                f"{f', {spec.gpus} GPU(s)' if spec.gpus else ''}; offered: {shapes}")

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        self.calls["launch"] += 1
        if request.request_id in self._by_request:      # idempotent by request id
            now = clock.monotonic()
            return [self._view(self.vms[i], now) for i in self._by_request[request.request_id] if i in self.vms]
        offer = request.offer
        if offer.provider != self.name or offer.region != self.cloud.region:
            raise SpecError("launch.offer", f"an offer of {offer.provider}/{offer.region} was given to the "
                                            f"simulated {self.name}/{self.cloud.region}")
        t = self.cloud.type(offer.instance_type)
        tags = self.capabilities.tags.encode({**request.tags, TAG_REQUEST: request.request_id})
        live = self.live[t.name]
        if live + request.count > t.capacity:
            raise CapacityError(f"{t.name}: {t.capacity - live} left, {request.count} asked",
                                provider=self.name, code="InsufficientInstanceCapacity")
        now = clock.monotonic()
        out = []
        for _ in range(request.count):
            self._seq += 1
            iid = f"{self.name}-{self._seq:07d}"
            boot = self.rng.lognormvariate(math.log(self.cloud.boot_median_s), self.cloud.boot_sigma)
            machine = SimMachine(iid, nic=Link(f"{iid}:nic", t.nic_gbps * GBIT), egress=self.egress,
                                 registry_sizes=self.registry_sizes,
                                 container_start_s=self.cloud.container_start_s)
            billed = self.cloud.billed_price(t.name, offer.spot)
            inst = Instance(id=iid, provider=self.name, region=self.cloud.region, instance_type=t.name,
                            spec=request.spec, state=ProviderState.PENDING,
                            tags=self.capabilities.tags.decode(tags), launched_at=now,
                            price_per_hour=offer.price_per_hour if offer.price_per_hour is not None else billed,
                            address=iid, zone=offer.zone)
            vm = self.vms[iid] = SimVm(inst, t, offer.spot, machine, now, now + boot,
                                       sticky=self.sticky_terminations)
            self._launched_at.append(now)
            self._boot_s.append(boot)
            self.live[t.name] += 1
            if vm.spot and self.cloud.spot_interruptions_per_hour > 0:
                after = self.rng.expovariate(self.cloud.spot_interruptions_per_hour / 3600.0)
                asyncio.get_running_loop().call_at(now + boot + after, self._interrupt, iid)
            out.append(inst)
        self._by_request[request.request_id] = [i.id for i in out]
        return out

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        self.calls["describe"] += 1
        now, pending = clock.monotonic(), ProviderState.PENDING
        # the reconciler asks about every live instance each minute: a settled one is its record
        return [inst if (inst := vm.instance).state is not pending else self._view(vm, now)
                for vm in map(self.vms.get, ids) if vm is not None]

    async def terminate(self, ids: Sequence[str]) -> None:
        self.calls["terminate"] += 1
        for i in ids:
            vm = self.vms.get(i)
            if vm is None or vm.gone:
                continue
            vm.terminate_calls += 1
            if vm.terminate_calls > vm.sticky:
                self._end(vm)

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        self.calls["list"] += 1
        codec = self.capabilities.tags
        now = clock.monotonic()
        live = [self._view(vm, now) for vm in self.vms.values() if not vm.gone]
        if not tags:
            return [i for i in live if TAG_FLEET in i.tags]
        wanted = codec.encode(tags)
        return [i for i in live if all(i.tags.get(k) == v for k, v in codec.decode(wanted).items())]

    def runner(self, instance: Instance) -> Runner:
        vm = self.vms.get(instance.id)
        if vm is None:
            raise SpecError("instance", f"{instance.id} is not an instance of {self.name}")
        return vm.machine

    # ---- the simulation ------------------------------------------------------------------
    def _view(self, vm: SimVm, now: float) -> Instance:
        """``vm`` as listed now: its record, which an end or a stop updates at once and a
        boot when it is first looked at after ``boots_at``."""
        if vm.instance.state is ProviderState.PENDING and now >= vm.boots_at:
            vm.instance = replace(vm.instance, state=ProviderState.RUNNING)
        return vm.instance

    def _end(self, vm: SimVm) -> None:
        vm.terminated_at = clock.monotonic()
        vm.instance = replace(vm.instance, state=ProviderState.TERMINATED)
        self.live[vm.type.name] -= 1
        vm.machine.kill()
        asyncio.get_running_loop().call_at(vm.terminated_at + FORGET_AFTER_S, self._forget, vm)

    def _forget(self, vm: SimVm) -> None:
        """``vm`` is no longer listed: only its bill and counts stay."""
        del self.vms[vm.instance.id]
        self._forgotten_usd += self._billed_usd(vm, vm.terminated_at or 0.0)
        self._forgotten["interrupted"] += vm.interrupted
        self._forgotten["stopped"] += vm.stopped_at is not None

    def _interrupt(self, iid: str) -> None:
        vm = self.vms.get(iid)
        if vm is not None and not vm.gone:
            vm.interrupted = True
            self._end(vm)

    def _vm(self, instance_id: str) -> SimVm:
        vm = self.vms.get(instance_id)
        if vm is None:
            raise SpecError("instance_id", f"{instance_id!r} is not an instance of the simulated {self.name}")
        return vm

    def preempt(self, instance_id: str) -> bool:
        """Remove ``instance_id`` now, behind the SDK's back (a spot reclaim, a host
        failure): its machine dies under whatever runs on it, it reads ``terminated``,
        is no longer listed, and billing stops.  False when it was gone already."""
        vm = self._vm(instance_id)
        if vm.gone:
            return False
        self._interrupt(instance_id)
        return True

    def stop(self, instance_id: str) -> bool:
        """Stop ``instance_id`` behind the SDK's back: it reads ``STOPPED`` and stays
        listed, its machine is gone and its compute is no longer billed (a terminate
        still ends it).  False when it was stopped or gone already."""
        vm = self._vm(instance_id)
        if vm.gone or vm.stopped_at is not None:
            return False
        vm.stopped_at = clock.monotonic()
        vm.instance = replace(vm.instance, state=ProviderState.STOPPED)
        vm.machine.kill()
        return True

    def stick(self, instance_id: str, calls: int) -> None:
        """Make ``instance_id`` survive ``calls`` more terminate calls from now on."""
        check_number("sim.stick.calls", calls, lo=0, hi=1_000_000, integer=True)
        vm = self._vm(instance_id)
        vm.sticky = vm.terminate_calls + calls

    def terminate_calls(self, instance_id: str) -> int:
        """How many terminate calls have named ``instance_id`` so far."""
        return self._vm(instance_id).terminate_calls

    def cost(self, now: float | None = None) -> float:
        """Dollars billed so far: each VM's price (what the cloud bills in the market it
        was launched in) for its billed time (at least ``billing_min_s``), launch to
        termination (or stop)."""
        t = clock.monotonic() if now is None else now
        return self._forgotten_usd + sum(self._billed_usd(vm, t) for vm in self.vms.values())

    def _billed_usd(self, vm: SimVm, now: float) -> float:
        return self.cloud.billed_price(vm.type.name, vm.spot) * vm.billed_s(now, self.cloud.billing_min_s) / 3600.0

    def stats(self) -> dict[str, Any]:
        """``vms``: launched so far; ``listed``: still listed; ``interrupted``, ``stopped``:
        of all launched; ``calls``: API calls by name."""
        listed = self.vms.values()
        return {"vms": self.launched, "listed": len(self.vms),
                "interrupted": self._forgotten["interrupted"] + sum(vm.interrupted for vm in listed),
                "stopped": self._forgotten["stopped"] + sum(vm.stopped_at is not None for vm in listed),
                "calls": dict(self.calls)}

