"""The ``k8s`` provider's pure parts, on the shapes the API returns: labels that Kubernetes
accepts and that decode back, capacity from nodes, pods and quotas, pod names, the error
mapping of the official client's ``ApiException`` and the exec stream's exit Status."""

from __future__ import annotations

import json
import re

import pytest

from flowmesh_sdk.errors import AuthError, NotFoundError, ProviderError, ProviderUnavailableError, QuotaError, \
    ThrottledError
from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.tags import KubeLabels

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client.exceptions import ApiException  # noqa: E402

from flowmesh_providers.k8s import capacity, pods  # noqa: E402
from flowmesh_providers.k8s.errors import map_api_error  # noqa: E402
from flowmesh_providers.k8s.stream import exit_code  # noqa: E402

# apimachinery's validation (kubernetes.io/docs/concepts/overview/working-with-objects/labels)
VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("value", ["default", "Conf_Pool.A-1", "x y/z:1", "-lead", "trail_", "zone", "z", "",
                                   "ünï", "a" * 63, "b" * 200, "root@host.example:22"])
def test_labels_are_valid_kubernetes_labels_and_decode_back(value):
    codec = KubeLabels()
    tags = {"flowmesh:pool": value, "team-" + value[:10]: value} if value else {"flowmesh:pool": value}
    encoded = codec.encode(tags)
    for key, v in encoded.items():
        prefix, _, name = key.partition("/")
        assert prefix in ("flowmesh.io", "tags.flowmesh.io") and 1 <= len(name) <= 63 and VALUE.match(name), key
        assert len(v) <= 63 and VALUE.match(v), v
    decoded = codec.decode(encoded)
    if len(value) <= 40:
        assert decoded == tags
    else:   # cut to 63 and hashed: not reversible, but a filter by the same value still matches
        assert codec.encode(tags) == encoded and decoded["flowmesh:pool"].endswith(encoded["flowmesh.io/pool"][-10:])


def _node(name, cpu="8", memory="32Gi", pods_="110", gpus=0, product=None, ready=True, unschedulable=False):
    alloc = {"cpu": cpu, "memory": memory, "pods": pods_}
    if gpus:
        alloc[pods.GPU_RESOURCE] = str(gpus)
    return {"metadata": {"name": name, "labels": {pods.GPU_PRODUCT_LABEL: product} if product else {}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(node, cpu="1", memory="1Gi", phase="Running", gpus=0):
    req = {"cpu": cpu, "memory": memory, **({pods.GPU_RESOURCE: str(gpus)} if gpus else {})}
    return {"spec": {"nodeName": node, "containers": [{"resources": {"requests": req}}]}, "status": {"phase": phase}}


def test_capacity_is_allocatable_minus_the_requests_of_bound_live_pods():
    spec = InstanceSpec(cpus=2, memory_gb=4)
    nodes = [_node("a"), _node("b", cpu="4000m", memory="4Gi"), _node("down", ready=False),
             _node("cord", unschedulable=True)]
    bound = [_pod("a", cpu="3500m"), _pod("a", cpu="1", phase="Succeeded"), _pod(None, cpu="8")]
    # a: 8 - 3.5 = 4.5 cpus -> 2 pods; b: 4 GiB holds 1; down and cordoned nodes hold none; an
    # ended pod and an unbound one take nothing
    assert capacity.node_fits(nodes, bound, spec) == 3
    assert capacity.node_fits([_node("p", pods_="3")], [_pod("p", cpu="0"), _pod("p", cpu="0")], spec) == 1
    gpu = InstanceSpec(cpus=1, memory_gb=1, gpus=1, gpu_name="NVIDIA-H100")
    gnodes = [_node("g1", gpus=8, product="NVIDIA-H100"), _node("g2", gpus=8, product="NVIDIA-A10"), _node("c")]
    assert capacity.node_fits(gnodes, [_pod("g1", gpus=6)], gpu) == 2


def test_quotas_bound_what_a_namespace_admits():
    spec = InstanceSpec(cpus=2, memory_gb=4)
    q = [{"status": {"hard": {"pods": "10", "requests.cpu": "9", "limits.memory": "64Gi"},
                     "used": {"pods": "2", "requests.cpu": "3500m", "limits.memory": "0"}}}]
    assert capacity.quota_fits(q, spec) == 2            # (9 - 3.5) // 2
    assert capacity.quota_fits([], spec) is None
    full = [{"status": {"hard": {"pods": "0"}, "used": {}}}]
    assert capacity.quota_fits(full, spec) == 0


def test_pod_names_are_dns_labels_unique_per_request_and_index():
    names = {pods.pod_name(rid, i) for rid in ("Pool_A-0123abcd", "pool-a-0123abcd", "x" * 200) for i in range(3)}
    assert len(names) == 9 and all(DNS_LABEL.match(n) and len(n) <= 63 for n in names), names


def _api(status, reason="", message="", headers=None):
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "reason": reason, "message": message, "code": status})
    exc.headers = headers or {}
    return exc


def test_api_errors_map_onto_the_sdk_tree():
    quota = map_api_error(_api(403, "Forbidden", 'pods "p" is forbidden: exceeded quota: q, requested: pods=1, '
                                                 "used: pods=1, limited: pods=1"), where="create", context="c")
    assert isinstance(quota, QuotaError) and "exceeded quota" in str(quota)
    rbac = map_api_error(_api(403, "Forbidden", 'pods is forbidden: User "u" cannot create'), where="w", context="c")
    assert isinstance(rbac, AuthError) and "context 'c'" in str(rbac)
    slow = map_api_error(_api(429, "TooManyRequests", "slow down", {"Retry-After": "3"}), where="w", context="c")
    assert isinstance(slow, ThrottledError) and slow.retry_after_s == 3.0
    assert isinstance(map_api_error(_api(404, "NotFound"), where="w", context="c"), NotFoundError)
    assert isinstance(map_api_error(_api(503, "ServiceUnavailable"), where="w", context="c"), ProviderUnavailableError)
    exists = map_api_error(_api(409, "AlreadyExists"), where="w", context="c")
    assert type(exists) is ProviderError and exists.code == "AlreadyExists"


def test_the_exec_status_gives_the_exit_code():
    assert exit_code({"metadata": {}, "status": "Success"}) == 0
    assert exit_code({"status": "Failure", "reason": "NonZeroExitCode",
                      "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}}) == 42
    assert exit_code({"status": "Failure", "message": "internal error"}) == 1
    assert exit_code(None) == -1            # cut without a Status: not a success
