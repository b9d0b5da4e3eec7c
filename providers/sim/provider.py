"""The simulated provider: the provider contract over a :class:`~.cloud.SimCloud`, on
virtual time, so that the real pools, provisioner and concurrency control run above it
unchanged.

* ``launch`` fails with ``CapacityError`` past a type's capacity (the provisioner then
  fails over to the next offer, as on a real cloud); each instance boots after a
  lognormal delay drawn from the seeded RNG and is ``pending`` until then.
* spot instances are interrupted at the cloud's Poisson rate: the machine dies under
  whatever runs on it and the instance reads ``terminated``.
* every call is counted (``calls``) and every instance's billed time is kept, so
  :meth:`cost` is what the run would have been charged.
"""

from __future__ import annotations

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
from flowmesh_sdk.specs import InstanceSpec, Offer

from .cloud import GBIT, SimCloud, SimInstanceType
from .machine import SimMachine
from .network import Link


@dataclass
class SimVm:
    instance: Instance
    type: SimInstanceType
    spot: bool
    machine: SimMachine
    launched_at: float
    boots_at: float
    terminated_at: float | None = None
    interrupted: bool = False

    def billed_s(self, now: float, minimum: float) -> float:
        end = self.terminated_at if self.terminated_at is not None else now
        return max(minimum, end - self.launched_at)


class SimProvider(Provider):
    capabilities = Capabilities()   # replaced per instance from the cloud's profile

    def __init__(self, cloud: SimCloud, *, images: Mapping[str, int], seed: int = 0,
                 types: Sequence[str] | None = None, spot: bool = False) -> None:
        """``types`` limits the offers to those instance types; ``spot`` offers the spot
        price of types that have one (instead of on-demand)."""
        self.cloud = cloud
        self.offered = tuple(types) if types is not None else tuple(t.name for t in cloud.types)
        for name in self.offered:
            cloud.type(name)
        self.spot = spot
        self.name = cloud.name  # type: ignore[misc]
        self.capabilities = Capabilities(spot=True, max_batch=cloud.max_batch, remote=True,  # type: ignore[misc]
                                         rates=cloud.rates)
        self.rng = random.Random(seed)
        self.registry_sizes = dict(images)
        self.egress = Link(f"{cloud.name}:registry", cloud.registry_egress_gbps * GBIT) \
            if cloud.registry_egress_gbps else None
        self.vms: dict[str, SimVm] = {}
        self.calls: collections.Counter[str] = collections.Counter()
        self.live: collections.Counter[str] = collections.Counter()   # live VMs per type
        self._by_request: dict[str, list[str]] = {}
        self._seq = 0

    def __repr__(self) -> str:
        return f"SimProvider({self.cloud.name}/{self.cloud.region}, {len(self.vms)} vms)"

    # ---- the contract ----------------------------------------------------------------
    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        self.calls["offers"] += 1
        out = []
        for name in self.offered:
            t = self.cloud.type(name)
            spot = self.spot and t.spot_price_per_hour is not None
            o = Offer(provider=self.name, region=self.cloud.region, instance_type=t.name, cpus=t.cpus,
                      memory_gb=t.memory_gb, spot=spot, source="simulated",
                      price_per_hour=t.spot_price_per_hour if spot else t.price_per_hour)  # type: ignore[arg-type]
            if o.fits(spec):
                out.append(o)
        return out

    async def launch(self, request: LaunchRequest) -> list[Instance]:
        self.calls["launch"] += 1
        if request.request_id in self._by_request:      # idempotent by request id
            return [self.vms[i].instance for i in self._by_request[request.request_id]]
        t = self.cloud.type(request.offer.instance_type)
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
            inst = Instance(id=iid, provider=self.name, region=self.cloud.region, instance_type=t.name,
                            spec=request.spec, state=ProviderState.PENDING,
                            tags={**request.tags, TAG_REQUEST: request.request_id}, launched_at=now,
                            price_per_hour=request.offer.price_per_hour, address=iid)
            vm = self.vms[iid] = SimVm(inst, t, request.offer.spot, machine, now, now + boot)
            self.live[t.name] += 1
            if vm.spot and self.cloud.spot_interruptions_per_hour > 0:
                after = self.rng.expovariate(self.cloud.spot_interruptions_per_hour / 3600.0)
                asyncio.get_running_loop().call_at(now + boot + after, self._interrupt, iid)
            out.append(inst)
        self._by_request[request.request_id] = [i.id for i in out]
        return out

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        self.calls["describe"] += 1
        return [self._view(self.vms[i]) for i in ids if i in self.vms]

    async def terminate(self, ids: Sequence[str]) -> None:
        self.calls["terminate"] += 1
        now = clock.monotonic()
        for i in ids:
            vm = self.vms.get(i)
            if vm is not None and vm.terminated_at is None:
                vm.terminated_at = now
                self.live[vm.type.name] -= 1

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        self.calls["list"] += 1
        live = [self._view(vm) for vm in self.vms.values() if vm.terminated_at is None]
        if not tags:
            return [i for i in live if TAG_FLEET in i.tags]
        return [i for i in live if all(i.tags.get(k) == v for k, v in tags.items())]

    def runner(self, instance: Instance) -> Runner:
        vm = self.vms.get(instance.id)
        if vm is None:
            raise SpecError("instance", f"{instance.id} is not an instance of {self.name}")
        return vm.machine

    # ---- the simulation ------------------------------------------------------------------
    def _view(self, vm: SimVm) -> Instance:
        now = clock.monotonic()
        if vm.terminated_at is not None:
            state = ProviderState.TERMINATED
        elif now < vm.boots_at:
            state = ProviderState.PENDING
        else:
            state = ProviderState.RUNNING
        if state is vm.instance.state:
            return vm.instance
        vm.instance = replace(vm.instance, state=state)
        return vm.instance

    def _interrupt(self, iid: str) -> None:
        vm = self.vms[iid]
        if vm.terminated_at is None:
            vm.interrupted = True
            vm.terminated_at = clock.monotonic()
            self.live[vm.type.name] -= 1
            vm.machine.kill()

    def cost(self, now: float | None = None) -> float:
        """Dollars billed so far: each VM's price for its billed time (at least
        ``billing_min_s``), launch to termination."""
        t = clock.monotonic() if now is None else now
        return sum(vm.instance.price_per_hour * vm.billed_s(t, self.cloud.billing_min_s) / 3600.0
                   for vm in self.vms.values())

    def stats(self) -> dict[str, Any]:
        return {"vms": len(self.vms), "interrupted": sum(vm.interrupted for vm in self.vms.values()),
                "calls": dict(self.calls)}

