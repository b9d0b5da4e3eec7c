"""What the core knows of ``k8s``, the user's Kubernetes clusters (see
:mod:`flowmesh_sdk.descriptor`): not in the price catalog (a cluster costs what the user
configures, free by default), pods as instances (containers: ``nested_containers=False``),
the client's buckets an assumption (:mod:`.client`)."""

from flowmesh_sdk.descriptor import ProviderDescriptor, ProviderProfile, Setting

from .client import RATES

DESCRIPTOR = ProviderDescriptor(
    name="k8s",
    provider="flowmesh_providers.k8s.provider:K8sProvider",
    aliases=("kubernetes",),
    profile=ProviderProfile("k8s", RATES, max_batch=16,
                            rates_source="assumption: 50 pod creates/s, burst 100 (the API server's "
                                         "Priority and Fairness answers 429 beyond its own limits)"),
    settings=(Setting("providers.k8s.kubeconfig", ("KUBECONFIG",), help="the kubeconfig file(s) to read"),),
    emulator="flowmesh_sdk.testing.k8s:KubeEmulator",
    conformance="flowmesh_providers.k8s.conformance:environment",
)
