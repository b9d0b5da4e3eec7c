"""``k8s``'s environment for the provider conformance suite
(:mod:`flowmesh_sdk.testing.conformance`): the Kubernetes API emulator (the suite's
``k8s_emulator``: pods are podman containers of an image in a local registry) with the
official client, through a kubeconfig of its own; every node lost is its capacity error
(the pod stays Pending, unschedulable, past the provider's bound)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from flowmesh_sdk.specs import InstanceSpec
from flowmesh_sdk.testing.conformance import ConformanceEnv, Fixture, cleaned_up, exhausting

from .provider import K8sProvider

SCHEDULE_TIMEOUT_S = 10.0


def rebuild(kubeconfig: str, image: str) -> K8sProvider:
    return K8sProvider(kubeconfig=kubeconfig, image=image, schedule_timeout_s=SCHEDULE_TIMEOUT_S)


@contextlib.asynccontextmanager
async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]:
    emu, image, _registry = fixture("k8s_emulator")
    kubeconfig = str(emu.kubeconfig(tmp / "kubeconfig"))
    prov = rebuild(kubeconfig, image)
    spec = InstanceSpec(cpus=1, memory_gb=1)
    (offer,) = await prov.offers(spec)
    nodes = [n.name for n in emu.nodes]

    def lose() -> None:
        for n in nodes:
            emu.lose_node(n)

    def back() -> None:
        for n in nodes:
            emu.restore_node(n)

    async with cleaned_up(prov):
        yield ConformanceEnv("k8s", prov, spec, offer, exhausting(lose, back),
                             ("flowmesh_providers.k8s.conformance:rebuild", {"kubeconfig": kubeconfig, "image": image}))
