"""agent-sandbox where the cluster serves it: a persistent pool's warm pods as SandboxClaims.

kubernetes-sigs/agent-sandbox publishes ``Sandbox`` (``agents.x-k8s.io``) and
``SandboxTemplate``, ``SandboxClaim``, ``SandboxWarmPool`` (``extensions.agents.x-k8s.io``).
Followed: release v0.5.6 (commit 211b7579cabed9460c1a692eb687084ff4c5879d), version
``v1beta1`` (the CRDs' storage version there; ``v1alpha1`` is served but deprecated):
``extensions/api/v1beta1/*_types.go``, ``api/v1beta1/sandbox_types.go``, ``k8s/crds/``, the
claim and warm pool controllers, and its Python client's constants
(``clients/python/agentic-sandbox-client/k8s_agent_sandbox/constants.py``).  Facts used:

* a SandboxWarmPool's ``spec.replicas`` (default 1) and ``spec.sandboxTemplateRef.name``;
  a SandboxTemplate's ``spec.podTemplate`` (``metadata`` labels/annotations, ``spec``) and
  ``networkPolicyManagement`` (``Unmanaged``: the controller makes no NetworkPolicy of its
  own; the SDK's policies select the pods by the labels the template gives them);
* a SandboxClaim's ``spec.warmPoolRef.name``; the controller adopts a warm sandbox (or makes
  one) and reports it in ``status.sandbox.name``, with ``Ready`` forwarded from the sandbox;
  its terminal reasons (``InvalidMetadata``, ``EnvVarsInjectionRejected``, ...);
* the sandbox's pod is named by its annotation ``agents.x-k8s.io/pod-name``, else after the
  sandbox; a claimed pod carries ``agents.x-k8s.io/claim-uid``; an unclaimed member of a
  warm pool ``agents.x-k8s.io/warm-pool-sandbox``;
* deleting a claim deletes its sandbox and pod (owner references), and the warm pool refills.

:class:`AgentSandbox` (one per provider): detection per context (``/apis`` lists both groups at
``v1beta1``), a SandboxTemplate and SandboxWarmPool per warm shape (named by a hash of the
namespace and the pod; ``replicas`` = the pool's ``warm_per_image``), a claim per warm pod
the pool asks for (named as the pod would be: idempotent), one watch of the namespace's
claims (:class:`~.watch.PodWatch` over the claims' list), and the release of a claim when its
pod is terminated.  The SDK's tags go on the claims (labels) and, for a pool's fixed tags, on
the template's pods; a claim's ``additionalPodMetadata`` is not used (the controller allows
only label domains on its allow-list, ``sandbox.users.io`` by default).  The warm pools and
templates go in :meth:`AgentSandbox.close`; a crashed coordinator's are ``flowmesh gc``'s
(:mod:`.sandbox_leftovers`: they carry the pool's labels, owner tag included).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from flowmesh_sdk.errors import CapacityError, NotFoundError, ProviderError, QuotaError
from flowmesh_sdk.provider import TAG_REQUEST, LaunchRequest

from . import pods
from .config import Target
from .errors import PROVIDER
from .watch import PodWatch

log = logging.getLogger("flowmesh.providers.k8s")
T = TypeVar("T")
EXT_GROUP = "extensions.agents.x-k8s.io"
CORE_GROUP = "agents.x-k8s.io"
VERSION = "v1beta1"
CLAIM_UID = "agents.x-k8s.io/claim-uid"
WARM_POOL = "agents.x-k8s.io/warm-pool-sandbox"
POD_NAME = "agents.x-k8s.io/pod-name"
# Ready=False reasons the claim controller does not recover from (its Python client's list, and the two
# a claim reports when what it names is missing)
TERMINAL = frozenset({"InvalidMetadata", "EnvVarsInjectionRejected", "VolumeClaimTemplatesError", "ClaimExpired",
                      "SandboxExpired", "WarmPoolNotFound", "TemplateNotFound"})
Call = Callable[[str, str, Callable[[Any], Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class AgentSandboxSupport:
    """What a context's API server says of agent-sandbox."""

    context: str
    served: bool                     # both groups at v1beta1
    versions: tuple[str, ...]        # of extensions.agents.x-k8s.io, as discovery lists them
    reason: str                      # why not, when not
    failed: bool = False             # discovery did not answer (unknown, not "not installed")


@dataclass(frozen=True, slots=True)
class Claimed:
    """A pod the provider holds through a claim."""

    target: Target
    claim: str
    claim_uid: str
    pod: str


def support_of(context: str, groups: Mapping[str, Any]) -> AgentSandboxSupport:
    """From an APIGroupList (``/apis``)."""
    served = {str(g.get("name")): tuple(str(v.get("version")) for v in g.get("versions") or ())
              for g in groups.get("groups") or ()}
    ext, core = served.get(EXT_GROUP, ()), served.get(CORE_GROUP, ())
    if VERSION in ext and VERSION in core:
        return AgentSandboxSupport(context, True, ext, "")
    if ext or core:
        why = (f"it serves {EXT_GROUP} {list(ext)} and {CORE_GROUP} {list(core)}, not {VERSION} "
               "(agent-sandbox v0.5 or newer)")
    else:
        why = f"it does not serve {EXT_GROUP} (agent-sandbox is not installed)"
    return AgentSandboxSupport(context, False, ext, why)


def pool_name(target: Target, pod: Mapping[str, Any]) -> str:
    """The SandboxTemplate's and SandboxWarmPool's name: a hash of the namespace and the pod."""
    body = {k: v for k, v in pod.items() if k != "metadata"}
    meta = pod.get("metadata") or {}
    text = json.dumps([target.namespace, body, meta.get("labels"), meta.get("annotations")], sort_keys=True)
    return "fm-swp-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def template_body(name: str, pod: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {"apiVersion": f"{EXT_GROUP}/{VERSION}", "kind": "SandboxTemplate",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"podTemplate": {"metadata": {"labels": dict(meta.get("labels") or {}),
                                                  "annotations": dict(meta.get("annotations") or {})},
                                     "spec": dict(pod.get("spec") or {})},
                     "networkPolicyManagement": "Unmanaged"}}


def warm_pool_body(name: str, replicas: int, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": f"{EXT_GROUP}/{VERSION}", "kind": "SandboxWarmPool",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": name}}}


def claim_body(name: str, warm_pool: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"apiVersion": f"{EXT_GROUP}/{VERSION}", "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": dict(labels)}, "spec": {"warmPoolRef": {"name": warm_pool}}}


def ready_of(claim: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(status, reason, message) of a claim's Ready condition."""
    for c in ((claim or {}).get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return str(c.get("status")), str(c.get("reason") or ""), str(c.get("message") or "")
    return "Unknown", "", ""


def bound_sandbox(claim: Mapping[str, Any] | None) -> str | None:
    return (((claim or {}).get("status") or {}).get("sandbox") or {}).get("name") or None


class _ClaimList:
    """The claims of a namespace in the shape :class:`PodWatch` lists and watches pods."""

    def __init__(self, custom: Any) -> None:
        self._custom = custom   # a kubernetes.client.CustomObjectsApi

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        return self._custom.list_namespaced_custom_object(EXT_GROUP, VERSION, namespace, "sandboxclaims", **kwargs)


class AgentSandbox:
    """The provider's agent-sandbox side (module docstring).  ``call`` is the provider's
    ``_call`` (off the loop, errors the SDK's); ``api_client(context)`` its ApiClient."""

    def __init__(self, *, enabled: bool, call: Call, api_client: Callable[[str], Awaitable[Any]],
                 timeout_s: float, deleting: set[str]) -> None:
        self.enabled = enabled
        self.deleting = deleting   # the provider's: uids TERMINATED from now on, whatever the watch has seen
        self._call = call
        self._api_client = api_client
        self.timeout_s = timeout_s
        self._support: dict[str, AgentSandboxSupport] = {}
        self._warned: set[str] = set()
        self._pools: dict[tuple[str, str], Target] = {}   # (target key, name) -> target: made by this provider
        self._claims: dict[str, PodWatch] = {}             # target key -> its claims' watch
        self.held: dict[str, Claimed] = {}                 # pod uid -> its claim

    # ---- detection ----------------------------------------------------------------------------
    async def support(self, context: str) -> AgentSandboxSupport:
        found = self._support.get(context)
        if found is None:
            from kubernetes import client   # the k8s extra
            try:
                resp = await self._call(context, "list API groups", lambda c: client.ApisApi(c).get_api_versions(
                    _preload_content=False))
                found = support_of(context, json.loads(resp.data or b"{}"))
            except ProviderError as exc:
                found = AgentSandboxSupport(context, False, (), f"discovery failed: {exc}", failed=True)
            self._support[context] = found
        return found

    async def usable(self, target: Target) -> bool:
        """Whether this launch's warm pods come from claims: asked for, and served."""
        if not self.enabled:
            return False
        found = await self.support(target.context)
        if not found.served and target.context not in self._warned:
            self._warned.add(target.context)
            log.warning("k8s: agent_sandbox=True, but context %r cannot serve claims: %s; its warm pods are the "
                        "SDK's own", target.context, found.reason)
        return found.served

    # ---- claims --------------------------------------------------------------------------------
    async def _custom(self, context: str, where: str, fn: Callable[[Any], T]) -> T:
        from kubernetes import client   # the k8s extra
        out: T = await self._call(context, where, lambda c: fn(client.CustomObjectsApi(c)))
        return out

    async def _create(self, target: Target, plural: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        try:
            await self._custom(target.context, f"create {plural} {name}", lambda c: c.create_namespaced_custom_object(
                EXT_GROUP, VERSION, target.namespace, plural, body, _preload_content=False))
        except ProviderError as exc:
            if exc.code != "AlreadyExists":
                raise

    async def _delete(self, target: Target, plural: str, name: str) -> None:
        try:
            await self._custom(target.context, f"delete {plural} {name}", lambda c: c.delete_namespaced_custom_object(
                EXT_GROUP, VERSION, target.namespace, plural, name, _preload_content=False))
        except NotFoundError:
            pass

    async def warm_pools(self, target: Target, label_selector: str) -> list[dict[str, Any]]:
        """The namespace's SandboxWarmPools that ``label_selector`` selects (through ``call``)."""
        got = await self._custom(target.context, "list sandboxwarmpools", lambda c: json.loads(
            c.list_namespaced_custom_object(EXT_GROUP, VERSION, target.namespace, "sandboxwarmpools",
                                            label_selector=label_selector, _preload_content=False).data or b"{}"))
        return list(got.get("items") or ())

    def made(self, target: Target, name: str) -> bool:
        """Whether this provider made the warm pool ``name`` there and still holds it."""
        return (target.key, name) in self._pools

    async def delete_pool(self, target: Target, name: str) -> None:
        """Delete a SandboxWarmPool and its SandboxTemplate (same name); its unclaimed sandboxes go."""
        for plural in ("sandboxwarmpools", "sandboxtemplates"):
            await self._delete(target, plural, name)
        self._pools.pop((target.key, name), None)

    async def _watch(self, target: Target) -> PodWatch:
        w = self._claims.get(target.key)
        if w is None:
            from kubernetes import client   # the k8s extra
            api = _ClaimList(client.CustomObjectsApi(await self._api_client(target.context)))
            w = self._claims.get(target.key)
            if w is None:
                w = self._claims[target.key] = PodWatch(target, api, asyncio.get_running_loop())
        await w.synced(30.0)
        return w

    async def ensure_pool(self, target: Target, pod: Mapping[str, Any], replicas: int,
                          labels: Mapping[str, str]) -> str:
        """The SandboxWarmPool (and its SandboxTemplate) of this pod's shape in the namespace."""
        name = pool_name(target, pod)
        if (target.key, name) not in self._pools:
            await self._create(target, "sandboxtemplates", template_body(name, pod, labels))
            await self._create(target, "sandboxwarmpools", warm_pool_body(name, replicas, labels))
            self._pools[(target.key, name)] = target
        return name

    async def launch(self, target: Target, pod_watch: PodWatch, request: LaunchRequest,
                     pod: Mapping[str, Any]) -> list[tuple[Claimed, Mapping[str, Any]]]:
        """``request.count`` claims on the warm pool of ``pod``'s shape, each bound and its pod
        placed; all or nothing."""
        assert request.container is not None
        fixed = pods.TAGS.encode({k: v for k, v in request.tags.items() if k != TAG_REQUEST})
        warm_pool = await self.ensure_pool(target, pod, request.container.stock, fixed)
        claims = await self._watch(target)
        names = [pods.pod_name(request.request_id, i) for i in range(request.count)]
        try:
            for name in names:
                if claims.get(name) is None:
                    await self._create(target, "sandboxclaims", claim_body(name, warm_pool,
                                                                           pods.TAGS.encode(request.tags)))
            got = await asyncio.gather(*(self._bound(target, claims, pod_watch, n) for n in names),
                                       return_exceptions=True)
        except BaseException:
            await asyncio.gather(*(self._delete(target, "sandboxclaims", n) for n in names), return_exceptions=True)
            raise
        errors = [g for g in got if isinstance(g, BaseException)]
        if errors:
            deleted = await asyncio.gather(*(self._delete(target, "sandboxclaims", n) for n in names),
                                           return_exceptions=True)
            # a pod bound meanwhile goes with its claim, once that delete is accepted: not listed from then
            # on, whatever the watch has seen (one whose claim could not be deleted stays, for gc to find)
            self.deleting.update(str((g[1].get("metadata") or {}).get("uid")) for g, d in zip(got, deleted)
                                 if not isinstance(g, BaseException) and not isinstance(d, BaseException))
            raise errors[0]
        out = [g for g in got if not isinstance(g, BaseException)]
        for claimed, placed in out:
            self.held[str((placed.get("metadata") or {}).get("uid"))] = claimed
        return out

    async def _bound(self, target: Target, claims: PodWatch, pod_watch: PodWatch,
                     name: str) -> tuple[Claimed, Mapping[str, Any]]:
        where = f"SandboxClaim {target.key}/{name}"

        def settled(claim: Mapping[str, Any] | None) -> bool:
            status, reason, _ = ready_of(claim)
            return claim is None or status == "True" or reason in TERMINAL or reason == "ReconcilerError" \
                or bound_sandbox(claim) is not None

        try:
            claim = await claims.wait(name, settled, self.timeout_s)
        except TimeoutError as exc:
            _, reason, message = ready_of(claims.get(name))
            raise CapacityError(f"{where} not bound after {self.timeout_s:g} s: {reason or 'no status'} {message}"
                                .strip(), provider=PROVIDER, code="ClaimNotBound") from exc
        if claim is None:
            raise CapacityError(f"{where} was deleted before it was bound", provider=PROVIDER, code="Deleted")
        self._refused(where, claim)
        sandbox = str(bound_sandbox(claim))
        sb = await self._custom(target.context, f"get sandbox {sandbox}", lambda c: json.loads(
            c.get_namespaced_custom_object(CORE_GROUP, VERSION, target.namespace, "sandboxes", sandbox,
                                           _preload_content=False).data))
        pod_name = str(((sb.get("metadata") or {}).get("annotations") or {}).get(POD_NAME) or sandbox)

        def placed(p: Mapping[str, Any] | None) -> bool:
            return p is not None and (pods.scheduled(p) or pods.instance_of(p, target).fault is not None)

        try:
            got = await pod_watch.wait(pod_name, placed, self.timeout_s)
        except TimeoutError as exc:
            self._refused(where, claims.get(name))
            found = pod_watch.get(pod_name)
            why = (pods.unschedulable(found) if found else None) or "not scheduled"
            raise CapacityError(f"{where}: pod {pod_name} still unschedulable after {self.timeout_s:g} s: {why}",
                                provider=PROVIDER, code="Unschedulable") from exc
        assert got is not None
        uid = str(((claim.get("metadata") or {}).get("uid")))
        return Claimed(target, name, uid, pod_name), got

    @staticmethod
    def _refused(where: str, claim: Mapping[str, Any] | None) -> None:
        status, reason, message = ready_of(claim)
        if status == "True" or not (reason in TERMINAL or reason == "ReconcilerError"):
            return
        if "exceeded quota" in message:
            raise QuotaError(f"{where}: {message}", provider=PROVIDER, code="ExceededQuota")
        raise ProviderError(f"{where} is not Ready: {reason}: {message}", provider=PROVIDER, code=reason)

    # ---- the pods it holds ------------------------------------------------------------------------
    def unclaimed(self, pod: Mapping[str, Any]) -> bool:
        """A warm pool's member no claim holds yet: not an instance of the SDK's."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        return WARM_POOL in labels and CLAIM_UID not in labels and str(meta.get("uid")) not in self.held

    def owns(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        return str(meta.get("uid")) in self.held or CLAIM_UID in (meta.get("labels") or {})

    async def release(self, target: Target, pod: Mapping[str, Any]) -> None:
        """Delete the claim that holds ``pod`` (its sandbox and pod go with it)."""
        meta = pod.get("metadata") or {}
        held = self.held.pop(str(meta.get("uid")), None)
        name = held.claim if held is not None else None
        if name is None:   # a restarted coordinator's: the claim with the pod's claim uid
            want = (meta.get("labels") or {}).get(CLAIM_UID)
            claims = await self._watch(target)
            name = next((str(c["metadata"]["name"]) for c in claims.live()
                         if (c.get("metadata") or {}).get("uid") == want), None)
        if name is not None:
            await self._delete(target, "sandboxclaims", name)
        self.deleting.add(str(meta.get("uid")))   # the pod goes with its claim

    async def close(self) -> None:
        """Delete the warm pools and templates this provider made (their unclaimed sandboxes go)."""
        for (_, name), target in list(self._pools.items()):
            try:
                await self.delete_pool(target, name)
            except ProviderError as exc:
                log.warning("k8s: warm pool %s/%s not deleted: %s", target.key, name, exc)
        self._pools.clear()
        for w in self._claims.values():
            await asyncio.to_thread(w.stop)
        self._claims.clear()
