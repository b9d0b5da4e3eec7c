"""An instance as a pool manages it: lifecycle, slots, image cache, warm sandboxes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .. import clock
from ..images import ImageInfo
from ..identity import is_digest, label_digest, sandbox_h_exec
from ..lifecycle import InstanceState, Lifecycle, instance_lifecycle
from ..provider import Instance, Provider
from ..remote.runtime import ContainerRuntime
from ..sandbox import Sandbox
from ..specs import BootstrapReport, InfraFailure, Offer, SandboxSpec

WarmKey = str   # the container's H_exec (flowmesh_sdk.identity.sandbox_h_exec)


def warm_key(spec: SandboxSpec, digest: str) -> WarmKey:
    """What a container fixes at creation (env and timeouts are per command), as its
    H_exec: same image digest + same limits, network and workdir -> same warm slot.  Keyed
    by the image digest, not the tag: a moved tag never hands out an old warm container."""
    if not is_digest(digest):   # a resolver that returned an image id without "sha256:"
        digest = label_digest(digest)
    return sandbox_h_exec(spec, digest)


@dataclass(slots=True)
class CachedImage:
    info: ImageInfo
    last_used: float
    in_use: int = 0
    fetched: bool = False   # pulled from its registry now (not already in the machine's store)


WARM_STARTS = 2   # warm containers one instance starts at once (each is a container runtime call)


class ManagedInstance:
    def __init__(self, instance: Instance, runtime: ContainerRuntime, slots: int, *,
                 provider: Provider, offer: Offer | None = None) -> None:
        self.instance = instance
        self.provider = provider      # the one that launched it (a pool may span several)
        self.offer = offer            # what it was launched as (priced)
        self.id = instance.id
        self.where = (provider.name, instance.region)   # one batched describe per provider and region
        self.runtime = runtime
        self.slots = slots
        self.active = 0
        self.lifecycle: Lifecycle[InstanceState] = instance_lifecycle(instance.id)
        self.images: dict[str, CachedImage] = {}    # digest -> what this instance holds
        self.warm: dict[WarmKey, list[Sandbox]] = {}
        self.warming: dict[WarmKey, int] = {}
        self.warm_starts = asyncio.Semaphore(WARM_STARTS)   # warm containers being started at once
        self.last_used = clock.monotonic()
        self.last_take = 0.0   # when a sandbox was last provisioned here (the warm refills wait for a lull)
        self.pulls: dict[str, asyncio.Future[CachedImage]] = {}   # digest -> pull in flight
        self.authfiles: dict[str, str] = {}   # registry -> its auth file's path on the machine
        self.wanted: dict[str, int] = {}      # digest -> sandboxes being made from it (not evictable)
        self.bootstrap: BootstrapReport | None = None
        self.loss: InfraFailure | None = None   # why it was given up, once it was (what its tasks report)
        self.loss_detail = ""                   # ... in words (the first give-up's detail)
        self.loss_check: asyncio.Future[object] | None = None   # asking its provider whether it was preempted

    def __repr__(self) -> str:
        return f"ManagedInstance({self.id} {self.state.value} {self.active}/{self.slots})"

    @property
    def state(self) -> InstanceState:
        return self.lifecycle.state

    @property
    def free(self) -> int:
        return self.slots - self.active if self.state is InstanceState.READY else 0

    def warm_count(self, key: WarmKey) -> int:
        return len(self.warm.get(key, ())) + self.warming.get(key, 0)

    def take_warm(self, key: WarmKey) -> Sandbox | None:
        stack = self.warm.get(key)
        while stack:
            sb = stack.pop()
            if not sb.closed:
                return sb
        return None

    def all_warm(self) -> list[Sandbox]:
        out = [sb for stack in self.warm.values() for sb in stack]
        self.warm.clear()
        return out

    def layers(self) -> set[str]:
        return {layer.digest for c in self.images.values() for layer in c.info.layers}

    def locality(self, info: ImageInfo) -> float:
        """FlowMesh's G_loc for an image here: 1.0 when held, else the share of its bytes
        already present as layers of other images (0.0 when nothing is known)."""
        if info.digest in self.images or info.digest in self.pulls:
            return 1.0  # held, or on its way: joining the pull beats starting another
        if not self.images or not info.size:   # nothing held yet (a fresh machine): no layer shared
            return 0.0
        have = self.layers()
        return sum(layer.size for layer in info.layers if layer.digest in have) / info.size

    def cache_bytes(self) -> int:
        seen: dict[str, int] = {}
        for c in self.images.values():
            for layer in c.info.layers:
                seen[layer.digest] = layer.size
        return sum(seen.values())
