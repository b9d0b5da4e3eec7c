"""The ``k8s`` provider: pods on the user's Kubernetes clusters, through the official client.

A pod is a container, so ``nested_containers=False``: an ephemeral pool's instance is its
task's sandbox, the pod runs the task's image (:attr:`LaunchRequest.container`), and the
agent's shell is exec'd into it once and held (:mod:`.stream`).  Where it runs: every
(context, namespace) target of :mod:`.config`, the offer's region and zone
(``infra=("k8s/<context>/<namespace>",)``).

``offers(spec)``
    One offer per target: the shape asked, ``available`` the pods of it the namespace can
    take now (:mod:`.capacity`: nodes' allocatable minus requests, bounded by the
    ResourceQuotas), priced at what the user configures per vCPU-, GiB- and GPU-hour
    (``price_per_cpu_hour`` ...; all 0 by default: the cluster is the user's own, ``free``).
``launch(request)``
    ``count`` pods (``max_batch`` 16), one create each, named from the request id (idempotent:
    pods of those names are the first call's), then watched until the scheduler places them.  A
    pod still unschedulable after ``schedule_timeout_s`` is deleted and the launch is a
    ``CapacityError`` with the scheduler's message (the pool fails over down its ranking); a
    namespace over quota is a ``QuotaError`` at create.  The namespace's two egress
    NetworkPolicies are created once per namespace (:func:`.pods.network_policies`), and one
    per egress allow-list the first time a pod needs it (:func:`.pods.allow_list_policy`;
    its host names resolved here, on the coordinator).
``describe(ids)`` / ``list_tagged(tags)``
    From the namespace's watch (:mod:`.watch`): no API call.  Ids are pod uids.
``terminate(ids)``
    ``DELETE`` each pod with grace period 0; a pod already gone is not an error.
``leftovers(fleet)`` / ``remove_leftovers(scan)``
    A crashed coordinator's agent-sandbox warm pools and templates (:mod:`.sandbox_leftovers`).
``runner(instance)``
    A :class:`.stream.PodRunner` over exec streams; its channels end with ``InstanceLost``
    the moment the watch sees the pod fail (evicted, preempted, node lost) or vanish.

Writes per sandbox: one create and one delete, plus its one exec stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from flowmesh_sdk import backends
from flowmesh_sdk.errors import CapacityError, FlowMeshError, InstanceLost, NotFoundError, ProviderError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_REQUEST, Capabilities, Instance, LaunchRequest, LeftoverScan, Provider,
                                   ProviderState)
from flowmesh_sdk.remote.runner import Runner
from flowmesh_sdk.specs import InstanceSpec, Offer, check_number

from . import capacity, config, pods
from .agent_sandbox import AgentSandbox, AgentSandboxSupport
from .api import Clusters, core, json_of
from .client import RATES
from .errors import PROVIDER
from .policies import EgressPolicies
from .portforward import Forwarded
from .runners import CUT_VERDICT_S, pod_runner
from .sandbox_leftovers import WarmPoolLeftovers
from .stream import PodRunner
from .tolerations import GPU_TOLERATION, Toleration, pod_tolerations, tolerations_of
from .watch import PodWatch

log = logging.getLogger("flowmesh.providers.k8s")
DEFAULT_RUNTIME_CLASSES = {"gvisor": "gvisor"}   # SandboxSpec.kernel -> the cluster's runtimeClassName


class K8sProvider(Provider):
    name = "k8s"
    capabilities = Capabilities(spot=False, gpus=True, max_batch=16, remote=True, rates=RATES, tags=pods.TAGS,
                                nested_containers=False, free=True)

    def __init__(self, *, kubeconfig: str | None = None, contexts: Sequence[str] | None = None,
                 namespaces: Sequence[str] | None = None, price_per_cpu_hour: float = 0.0,
                 price_per_gib_hour: float = 0.0, price_per_gpu_hour: float = 0.0,
                 schedule_timeout_s: float = 60.0, runtime_classes: Mapping[str, str] | None = None,
                 image_pull_secrets: Sequence[str] = (), metadata_networks: Sequence[str] | None = None,
                 image: str | None = None, max_workers: int = 16, agent_sandbox: bool = False,
                 tolerations: Sequence[Toleration | Mapping[str, Any]] = (),
                 gpu_tolerations: Sequence[Toleration | Mapping[str, Any]] | None = None,
                 gpu_label: str = pods.GPU_PRODUCT_LABEL, forward_ports: Sequence[int] = ()) -> None:
        """``image``: what a pod runs when the launch names no container (a GPU worker's, a
        test's); an ephemeral pool's launches always name their task's.  ``tolerations``: on
        every pod; ``gpu_tolerations``: on GPU shapes' pods too (None: ``nvidia.com/gpu`` Exists
        NoSchedule, :mod:`.tolerations` says why); ``gpu_label``: the node label a GPU shape's
        ``gpu_name`` selects on (GPU Feature Discovery's ``nvidia.com/gpu.product``; GKE without
        it: ``cloud.google.com/gke-accelerator``); ``forward_ports``: pod ports the coordinator
        reaches on the pod's own loopback address once it runs (:mod:`.portforward`; the
        runner's ``target.host``).  ``agent_sandbox``: where
        a context serves agent-sandbox's CRDs, a persistent pool's warm pods are SandboxClaims on a
        SandboxWarmPool the provider makes (:mod:`.agent_sandbox`); off by default: that pool keeps
        pods of its own beyond the pool's cap, and needs the controller and RBAC on its CRDs."""
        if not isinstance(agent_sandbox, bool):
            raise SpecError("k8s.agent_sandbox", f"must be True or False, got {agent_sandbox!r}")
        self.image = image
        self.tolerations = tolerations_of(tolerations)
        self.gpu_tolerations = (GPU_TOLERATION,) if gpu_tolerations is None else tolerations_of(gpu_tolerations)
        self.gpu_label = gpu_label
        for port in forward_ports:
            check_number("k8s.forward_ports", port, lo=1, hi=65535, integer=True)
        self.forward_ports = tuple(forward_ports)
        self._kubeconfig, self._contexts, self._namespaces = kubeconfig, contexts, namespaces
        for field, value in (("price_per_cpu_hour", price_per_cpu_hour), ("price_per_gib_hour", price_per_gib_hour),
                             ("price_per_gpu_hour", price_per_gpu_hour)):
            check_number(f"k8s.{field}", value, lo=0)
        check_number("k8s.schedule_timeout_s", schedule_timeout_s, lo=0, lo_open=True)
        self.prices = (float(price_per_cpu_hour), float(price_per_gib_hour), float(price_per_gpu_hour))
        if any(self.prices):
            self.capabilities = replace(type(self).capabilities, free=False)
        self.schedule_timeout_s = float(schedule_timeout_s)
        self.runtime_classes = dict(DEFAULT_RUNTIME_CLASSES if runtime_classes is None else runtime_classes)
        self.pull_secrets = tuple(image_pull_secrets)
        self._metadata = tuple(metadata_networks if metadata_networks is not None else backends.metadata_networks())
        self._api = Clusters(kubeconfig, contexts, namespaces, max_workers)   # the kubeconfig's contexts
        self._policies = EgressPolicies(self._api.call, self._metadata)   # the namespaces' egress NetworkPolicies
        self._watches: dict[str, PodWatch] = {}
        self._where: dict[str, tuple[config.Target, str]] = {}     # uid -> (target, pod name)
        self._uid_of: dict[tuple[str, str], str] = {}                # (target key, pod name) -> uid
        self._runners: dict[str, PodRunner] = {}
        self._deleting: set[str] = set()                            # uids whose delete the server accepted
        self._agent = AgentSandbox(enabled=agent_sandbox, call=self._api.call, timeout_s=self.schedule_timeout_s,
                                   api_client=self._api.api_client, deleting=self._deleting)
        self._leftovers = WarmPoolLeftovers(self._agent, self._targets)   # a crashed coordinator's warm pools

    # ---- plumbing --------------------------------------------------------------------
    async def _targets(self) -> list[config.Target]:
        return (await self._api.targets())[0]

    def _remember(self, uid: str, target: config.Target, name: str) -> None:
        self._where[uid] = (target, name)
        self._uid_of[(target.key, name)] = uid

    async def _watch(self, target: config.Target) -> PodWatch:
        w = self._watches.get(target.key)
        if w is None:
            await self._api.targets()
            api = core(await self._api.api_client(target.context))
            w = self._watches.get(target.key)   # another call may have made it meanwhile
            if w is None:
                w = self._watches[target.key] = PodWatch(target, api, asyncio.get_running_loop(),
                                                         on_change=lambda n, pod: self._changed(target, n, pod))
        await w.synced(30.0)
        return w

    def _changed(self, target: config.Target, name: str, pod: Mapping[str, Any] | None) -> None:
        """On the loop, for every watch event: end the streams into a pod that failed or went."""
        runner = self._runners.get(self._uid_of.get((target.key, name), ""))
        if runner is None:
            return
        if pod is None:
            runner.lost(InstanceLost(f"pod {target.key}/{name} was deleted"))
        else:
            inst = pods.instance_of(pod, target)
            if inst.fault is not None and inst.state is ProviderState.TERMINATED:
                runner.lost(InstanceLost(inst.fault.message))

    # ---- offers ----------------------------------------------------------------------
    def _price(self, spec: InstanceSpec) -> float:
        cpu, gib, gpu = self.prices
        return round(spec.cpus * cpu + spec.memory_gb * gib + spec.gpus * gpu, 6)

    async def offers(self, spec: InstanceSpec) -> list[Offer]:
        targets, _ = await self._api.targets()
        out = []
        for ctx in sorted({t.context for t in targets}):
            fits = await self._node_fits(ctx, spec)
            for t in [t for t in targets if t.context == ctx]:
                bound = capacity.quota_fits(await self._quotas(t), spec)
                available = fits if bound is None else (bound if fits is None else min(fits, bound))
                free = self.capabilities.free
                out.append(Offer(provider=PROVIDER, region=t.context, zone=t.namespace,
                                 instance_type=_shape(spec), cpus=spec.cpus, memory_gb=spec.memory_gb,
                                 gpus=spec.gpus, gpu_name=spec.gpu_name, arch=spec.arch,
                                 price_per_hour=0.0 if free else self._price(spec),
                                 offer_id=None if free else t.key, available=available,
                                 source="the user's cluster" if free else "configured cluster price"))
        return out

    async def _quotas(self, t: config.Target) -> list[dict[str, Any]]:
        got = await self._api.call(t.context, "list resource quotas", lambda c: json_of(
            core(c).list_namespaced_resource_quota(t.namespace, _preload_content=False)))
        return list(got.get("items") or ())

    async def _node_fits(self, ctx: str, spec: InstanceSpec) -> int | None:
        nodes = await self._api.call(ctx, "list nodes", lambda c: json_of(core(c).list_node(_preload_content=False)))
        try:
            bound = await self._api.call(ctx, "list pods", lambda c: json_of(core(c).list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)))
        except FlowMeshError as exc:
            if getattr(exc, "code", "") not in ("Forbidden", "403"):
                raise
            return None
        return capacity.node_fits(nodes.get("items") or (), bound.get("items") or (), spec,
                                  tolerations=self._tolerations(spec), gpu_label=self.gpu_label)

    def _tolerations(self, spec: InstanceSpec) -> tuple[Toleration, ...]:
        return pod_tolerations(spec.gpus, self.tolerations, self.gpu_tolerations)

    def explain_misfit(self, spec: InstanceSpec) -> str:
        return "no (context, namespace) of the kubeconfig matches; set K8sProvider(contexts=..., namespaces=...)"

    # ---- launch ----------------------------------------------------------------------
    async def launch(self, request: LaunchRequest) -> list[Instance]:
        offer = request.offer
        if offer.provider != PROVIDER:
            raise SpecError("launch.offer", f"is an offer of {offer.provider!r}, not of k8s")
        target = config.Target(offer.region, offer.zone or "default")
        targets, _ = await self._api.targets()
        if target not in targets:
            raise SpecError("launch.offer", f"names {target.key}, which is not a target of this provider "
                                            f"({', '.join(t.key for t in targets)})")
        image = request.container.image if request.container is not None else self.image
        if image is None:
            raise SpecError("launch.container", "a k8s instance is a pod running the task's image, and this launch "
                                                "names none (an ephemeral pool passes its task's; "
                                                "K8sProvider(image=...) sets one for other launches)")
        kernel = request.container.sandbox.kernel if request.container is not None else "host"
        runtime_class = self.runtime_classes.get(kernel) if kernel != "host" else None
        if kernel != "host" and runtime_class is None:
            raise SpecError("sandbox.kernel", f"{kernel!r} needs the cluster's runtimeClassName for it "
                                              f"(K8sProvider(runtime_classes={{{kernel!r}: ...}}))")
        watch = await self._watch(target)
        await self._policies.ensure(target)
        network = request.container.sandbox.network if request.container is not None else False
        resolved = await self._policies.allow_list(target, network) if isinstance(network, tuple) else None
        if request.container is not None and request.container.stock and await self._agent.usable(target):
            return await self._launch_claims(target, watch, request, image, runtime_class, resolved)
        names = [pods.pod_name(request.request_id, i) for i in range(request.count)]
        uids: dict[str, str | None] = {}   # the pods this call made: deleted with their uids, so TERMINATED at once
        try:
            for name in names:
                if watch.get(name) is None:
                    body = pods.sandbox_pod(name, request_tags=request.tags, spec=request.spec,
                                            container=request.container, image=image,
                                            instance_type=offer.instance_type,
                                            price_per_hour=offer.price_per_hour or 0.0, runtime_class=runtime_class,
                                            pull_secrets=self.pull_secrets, resolved=resolved,
                                            tolerations=self._tolerations(request.spec), gpu_label=self.gpu_label)
                    uids[name] = await self._create(target, name, body)
        except BaseException:
            # a launch is all or nothing: the pods this call made go before its error does
            await asyncio.gather(*(self._delete(target, n, uids.get(n)) for n in names), return_exceptions=True)
            raise
        placed = await asyncio.gather(*(self._scheduled(watch, target, n) for n in names), return_exceptions=True)
        errors = [p for p in placed if isinstance(p, BaseException)]
        if errors:
            await asyncio.gather(*(self._delete(target, n, uids.get(n)) for n in names))
            raise errors[0]
        out = []
        for name, pod in zip(names, placed):
            assert not isinstance(pod, BaseException)   # none failed: errors is empty
            inst = pods.instance_of(pod, target)
            self._remember(inst.id, target, name)
            out.append(inst)
        return out

    async def _launch_claims(self, target: config.Target, watch: PodWatch, request: LaunchRequest, image: str,
                             runtime_class: str | None, resolved: dict[str, list[str]] | None) -> list[Instance]:
        """A warm stock's pods as SandboxClaims (:mod:`.agent_sandbox`): the template's pod has the
        pool's fixed tags; each instance has the launch's."""
        fixed = {k: v for k, v in request.tags.items() if k != TAG_REQUEST}
        body = pods.sandbox_pod("template", request_tags=fixed, spec=request.spec, container=request.container,
                                image=image, instance_type=request.offer.instance_type,
                                price_per_hour=request.offer.price_per_hour or 0.0, runtime_class=runtime_class,
                                pull_secrets=self.pull_secrets, resolved=resolved)
        out = []
        for claimed, pod in await self._agent.launch(target, watch, request, body):
            inst = replace(pods.instance_of(pod, target), tags=dict(request.tags))
            self._remember(inst.id, target, claimed.pod)
            out.append(inst)
        return out

    async def agent_sandbox_support(self, context: str | None = None) -> AgentSandboxSupport:
        """Whether ``context`` (default: the first target's) serves agent-sandbox's CRDs at v1beta1."""
        targets, _ = await self._api.targets()
        return await self._agent.support(context or targets[0].context)

    async def _create(self, target: config.Target, name: str, body: dict[str, Any]) -> str | None:
        """The new pod's uid (None when a pod of that name was there already)."""
        try:
            made = await self._api.call(target.context, f"create pod {name}", lambda c: json.loads(
                core(c).create_namespaced_pod(target.namespace, body, _preload_content=False).data))
        except ProviderError as exc:
            if exc.code != "AlreadyExists":
                raise
            return None
        return str((made.get("metadata") or {}).get("uid") or "") or None

    async def _scheduled(self, watch: PodWatch, target: config.Target, name: str) -> Mapping[str, Any]:
        def placed(pod: Mapping[str, Any] | None) -> bool:
            return pod is None or pods.scheduled(pod) or pods.instance_of(pod, target).fault is not None

        try:
            pod = await watch.wait(name, placed, self.schedule_timeout_s)
        except TimeoutError as exc:
            pod = watch.get(name)
            why = (pods.unschedulable(pod) if pod else None) or "not scheduled"
            await self._delete(target, name)
            raise CapacityError(f"pod {target.key}/{name} still unschedulable after {self.schedule_timeout_s:g} s: "
                                f"{why}", provider=PROVIDER, code="Unschedulable") from exc
        if pod is None:
            raise CapacityError(f"pod {target.key}/{name} was deleted before it was scheduled", provider=PROVIDER,
                                code="Deleted")
        return pod

    # ---- describe, list, terminate ---------------------------------------------------
    async def _find(self, uid: str) -> tuple[config.Target, str, Mapping[str, Any]] | None:
        where = self._where.get(uid)
        if where is not None:
            watch = await self._watch(where[0])
            pod = watch.get(where[1])
            if pod is not None:
                return where[0], where[1], pod
        targets, _ = await self._api.targets()
        for t in targets:
            found = (await self._watch(t)).by_uid(uid)
            if found is not None:
                self._remember(uid, t, found[0])
                return t, found[0], found[1]
        return None

    async def describe(self, ids: Sequence[str]) -> list[Instance]:
        out = []
        for uid in ids:
            found = await self._find(uid)
            if found is None:
                continue
            target, name, pod = found
            inst = pods.instance_of(pod, target)
            if uid in self._deleting or self._watches[target.key].deleted(name) or inst.id != uid:
                inst = replace(inst, id=uid, state=ProviderState.TERMINATED)   # deleted (or being deleted)
            out.append(inst)
        return out

    async def list_tagged(self, tags: Mapping[str, str]) -> list[Instance]:
        targets, _ = await self._api.targets()
        want = dict(tags) or {}
        out = []
        for t in targets:
            for pod in (await self._watch(t)).live():
                inst = pods.instance_of(pod, t)
                if inst.id in self._deleting or (inst.state is ProviderState.TERMINATED and inst.fault is None) \
                        or self._agent.unclaimed(pod):
                    continue   # being deleted
                have = inst.tags
                if (want and all(have.get(k) == v for k, v in want.items())) or (not want and TAG_FLEET in have):
                    self._remember(inst.id, t, str(pod["metadata"]["name"]))
                    out.append(inst)
        return out

    async def _delete(self, target: config.Target, name: str, uid: str | None = None) -> None:
        """Delete pod ``name``; its uid (given, else the watch's) is TERMINATED from then on."""
        if uid is None:
            seen = self._watches[target.key].get(name) if target.key in self._watches else None
            uid = ((seen or {}).get("metadata") or {}).get("uid")
        try:
            await self._api.call(target.context, f"delete pod {name}", lambda c: core(c).delete_namespaced_pod(
                name, target.namespace, grace_period_seconds=0, _preload_content=False))
        except NotFoundError:
            pass
        if uid is not None:
            self._deleting.add(uid)   # accepted: TERMINATED from now on, whatever the watch has seen yet

    async def terminate(self, ids: Sequence[str]) -> None:
        found = [f for f in await asyncio.gather(*(self._find(uid) for uid in ids)) if f is not None]
        claimed = [f for f in found if self._agent.owns(f[2]) and (f[2].get("metadata") or {}).get("uid") in ids]
        await asyncio.gather(*(self._agent.release(t, pod) for t, _, pod in claimed))   # the pod goes with its claim
        found = [f for f in found if f not in claimed]
        await asyncio.gather(*(self._delete(t, name, uid) for t, name, pod in found
                               if (uid := (pod.get("metadata") or {}).get("uid")) in ids))
        for uid in ids:
            runner = self._runners.pop(uid, None)
            if runner is not None:
                await runner.close()

    async def leftovers(self, fleet: str | None = None) -> LeftoverScan:
        """The agent-sandbox warm pools the SDK labelled that no coordinator deleted (a crashed
        one's; not this provider's own): :mod:`.sandbox_leftovers`.  gc decides which to take."""
        return await self._leftovers.scan(fleet)

    async def remove_leftovers(self, scan: LeftoverScan) -> LeftoverScan:
        """Delete the warm pools (and their templates) ``scan`` lists; returns those still there."""
        return await self._leftovers.remove(scan)

    async def wait_changed(self, ids: Sequence[str], timeout_s: float) -> None:
        """Return at the first watch event that changes one of ``ids``' state (or its fault)."""
        waits = []
        for uid in ids:
            where = self._where.get(uid)
            if where is None:
                continue
            target, name = where
            watch = await self._watch(target)
            pod = watch.get(name)
            was = pods.instance_of(pod, target) if pod is not None else None
            key = (was.state, was.fault) if was is not None else None

            def moved(p: Mapping[str, Any] | None, t: config.Target = target,
                      key: tuple[Any, Any] | None = key) -> bool:
                now = pods.instance_of(p, t) if p is not None else None
                return (now.state, now.fault) != key if now is not None else True

            waits.append(asyncio.ensure_future(watch.wait(name, moved, timeout_s)))
        if not waits:
            await asyncio.sleep(timeout_s)
            return
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    # ---- runner ----------------------------------------------------------------------
    def runner(self, instance: Instance) -> Runner:
        found = self._runners.get(instance.id)
        if found is not None:
            return found
        where = self._where.get(instance.id)
        if where is None:
            where = (config.Target(instance.region, instance.zone or "default"), str(instance.address))
            self._remember(instance.id, *where)
        target, name = where
        runner = pod_runner(target, name, self._api.configuration(target.context), watch=self._watch,
                            send=self._api.send, forward_ports=self.forward_ports)
        self._runners[instance.id] = runner
        return runner

    async def forward(self, instance: Instance, remote_port: int, local_port: int | None = None) -> Forwarded:
        """Reach ``remote_port`` of the instance's pod from here: a listener on the pod's
        loopback address (``local_port`` None: the same port number; 0: any free one) whose
        connections go over ``pods/portforward`` (:mod:`.portforward`).  Closed with the
        runner (the pod's terminate, the provider's close)."""
        check_number("k8s.forward.remote_port", remote_port, lo=1, hi=65535, integer=True)
        runner = self.runner(instance)
        assert isinstance(runner, PodRunner) and runner.target is not None
        return await runner.target.open_one(remote_port, local_port)

    async def close(self) -> None:
        for runner in list(self._runners.values()):
            await runner.close()
        self._runners.clear()
        await self._agent.close()
        for w in self._watches.values():
            await asyncio.to_thread(w.stop)
        self._watches.clear()
        await self._api.close()


def _shape(spec: InstanceSpec) -> str:
    gpu = f"-{spec.gpus}x{(spec.gpu_name or 'gpu').replace(' ', '')}" if spec.gpus else ""
    return f"pod-{spec.cpus}c-{spec.memory_gb:g}g{gpu}"


# CUT_VERDICT_S moved to .runners, the network policies to .policies: still importable here
__all__ = ["CUT_VERDICT_S", "DEFAULT_RUNTIME_CLASSES", "K8sProvider"]
