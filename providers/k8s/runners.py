"""The runner of one pod (``K8sProvider.runner``): a :class:`.stream.PodRunner` over exec
streams whose hooks ask the namespace's watch (:mod:`.watch`): ``ready`` waits until the pod
runs (then opens its forwarded ports, :mod:`.portforward`), ``why_cut`` says whether a stream
that ended without an exit status lost its pod.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from flowmesh_sdk.errors import InstanceLost
from flowmesh_sdk.provider import ProviderState

from . import pods
from .config import Target
from .portforward import PodPorts
from .stream import CUT_VERDICT_S, PodRunner
from .watch import PodWatch


def pod_runner(target: Target, name: str, configuration: Any, *, watch: Callable[[Target], Awaitable[PodWatch]],
               send: Callable[[Callable[[], Any]], Awaitable[Any]], forward_ports: Sequence[int]) -> PodRunner:
    """The runner of pod ``name`` in ``target`` (``configuration``: its context's client
    configuration; ``watch(target)``: the namespace's synced watch; ``send``: runs a blocking
    callable on the provider's worker threads)."""
    path = f"/api/v1/namespaces/{target.namespace}/pods/{name}"
    ports = PodPorts(label=f"k8s:{target.key}/{name}", path=path, configuration=configuration, send=send)

    async def ready(timeout_s: float) -> None:
        w = await watch(target)

        def running(pod: Mapping[str, Any] | None) -> bool:
            if pod is None:
                return True
            inst = pods.instance_of(pod, target)
            return inst.state is not ProviderState.PENDING or inst.fault is not None

        pod = await w.wait(name, running, timeout_s)
        inst = pods.instance_of(pod, target) if pod is not None else None
        if inst is None or inst.state is not ProviderState.RUNNING:
            why = inst.fault.message if inst is not None and inst.fault else "it is gone"
            raise InstanceLost(f"pod {target.key}/{name} does not run: {why}")
        if forward_ports:
            await ports.open(forward_ports)

    async def why_cut() -> Exception | None:
        """A stream ended without an exit status: the pod's loss, if the watch reports one
        within CUT_VERDICT_S (evicted, preempted, its node lost, deleted), else None."""
        w = await watch(target)

        def ended(pod: Mapping[str, Any] | None) -> bool:
            return pod is None or pods.instance_of(pod, target).state is ProviderState.TERMINATED

        pod = await w.wait(name, ended, CUT_VERDICT_S)
        fault = pods.instance_of(pod, target).fault if pod is not None else None
        return InstanceLost(fault.message if fault else f"pod {target.key}/{name} was deleted")

    return PodRunner(label=f"k8s:{target.key}/{name}", path=path, configuration=configuration,
                     loop_send=send, ready=ready, why_cut=why_cut, target=ports)


__all__ = ["CUT_VERDICT_S", "pod_runner"]
