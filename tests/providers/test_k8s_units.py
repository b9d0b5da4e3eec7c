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


META = ("169.254.0.0/16", "fd00:ec2::254/128")


def test_an_allow_list_policy_holds_its_entries_and_never_the_metadata_networks():
    allow = ("10.0.0.0/8", "169.254.169.0/24", "0.0.0.0/0", "10.88.0.1:8080", "[fd00:ec2::254]:80", "pypi.org:443")
    resolved = {"pypi.org": ["151.101.0.223", "2a04:4e42::223"]}
    label = pods.network_label(allow, resolved)
    assert VALUE.fullmatch(label) and len(label) <= 63 and label.startswith("allow-")
    assert pods.network_label(allow, {"pypi.org": ["151.101.64.223"]}) != label   # resolved elsewhere: a new policy
    assert pods.allow_names(allow) == ["pypi.org"]
    pol = pods.allow_list_policy(label, allow, resolved, META)
    assert pol["spec"]["podSelector"] == {"matchLabels": {pods.NETWORK_LABEL: label}}
    assert pol["spec"]["policyTypes"] == ["Egress"]
    rules = [(tuple(b["ipBlock"].get("cidr") for b in r["to"]), tuple(b["ipBlock"].get("except") for b in r["to"]),
              tuple((p["protocol"], p["port"]) for p in r.get("ports", ()))) for r in pol["spec"]["egress"]]
    both = (("TCP", 8080), ("UDP", 8080))
    assert rules == [
        (("10.0.0.0/8",), (None,), ()),
        # 169.254.169.0/24 lies inside a metadata network: dropped; 0.0.0.0/0 holds one: cut out
        (("0.0.0.0/0",), (["169.254.0.0/16"],), ()),
        (("10.88.0.1/32",), (None,), both),
        # [fd00:ec2::254]:80 is a metadata address: dropped
        (("151.101.0.223/32", "2a04:4e42::223/128"), (None, None), (("TCP", 443), ("UDP", 443))),
    ], rules
    with pytest.raises(Exception, match="sandbox.network"):
        pods.network_label(("pypi.org:443",), None)


def test_the_emulator_enforces_the_policies_that_select_a_pod():
    from flowmesh_sdk.testing.k8s import netpol
    label = pods.network_label(("10.88.0.1:8080", "10.0.0.0/8"), {})
    policies = pods.network_policies(META) + [pods.allow_list_policy(label, ("10.88.0.1:8080", "10.0.0.0/8"), {},
                                                                     META)]

    def ruleset(network: str) -> str | None:
        pod = {"metadata": {"labels": {pods.NETWORK_LABEL: network}}}
        return netpol.egress_ruleset(netpol.egress_policies(policies, pod))

    listed = ruleset(label)
    assert "ip daddr 10.88.0.1/32 tcp dport 8080 accept" in listed and "ip daddr 10.0.0.0/8 accept" in listed
    assert "policy drop" in listed and "reject with tcp reset" in listed
    assert "accept" not in ruleset("none").split("established,related accept")[1]   # nothing but replies
    assert "ip daddr 0.0.0.0/0 ip daddr != { 169.254.0.0/16 } accept" in ruleset("all")
    assert ruleset("unselected") is None                                  # no policy: unrestricted
    everything = [{"spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}}]
    assert netpol.egress_ruleset(netpol.egress_policies(everything, {"metadata": {"labels": {}}})) is None
