"""The egress NetworkPolicies the ``k8s`` provider keeps in each namespace it launches into:
the namespace's two (:func:`.pods.network_policies`), created once per namespace, and one per
egress allow-list the first time a pod needs it (:func:`.pods.allow_list_policy`), its host
names resolved here, on the coordinator.  A policy that already exists is not an error.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from flowmesh_sdk.errors import ProviderError, SpecError

from . import pods
from .config import Target

Call = Callable[[str, str, Callable[[Any], Any]], Awaitable[Any]]


def _networking(api_client: Any) -> Any:
    from kubernetes import client   # the k8s extra
    return client.NetworkingV1Api(api_client)


class EgressPolicies:
    """The policies made so far (by namespace key, and by (namespace key, allow-list label));
    ``call(context, where, fn)`` runs ``fn(ApiClient)`` off the loop, errors mapped;
    ``metadata`` are the networks no pod may reach."""

    def __init__(self, call: Call, metadata: tuple[str, ...]) -> None:
        self._call = call
        self.metadata = metadata
        self._made: set[str | tuple[str, str]] = set()   # namespaces; (namespace, allow-list label)

    async def ensure(self, target: Target) -> None:
        """The namespace's own two policies (once per namespace)."""
        if target.key in self._made:
            return
        for body in pods.network_policies(self.metadata):
            await self._create(target, body)
        self._made.add(target.key)

    async def allow_list(self, target: Target, network: tuple[str, ...]) -> dict[str, list[str]]:
        """Resolve the allow-list's host names here, on the coordinator (a NetworkPolicy
        cannot name hosts; the cluster's DNS may answer otherwise), and make sure its policy
        exists in the namespace.  The addresses are in the policy's name: a host that
        resolves elsewhere later gets a new policy for its new pods."""
        resolved: dict[str, list[str]] = {}
        for host in pods.allow_names(network):
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except OSError as exc:
                raise SpecError("sandbox.network", f"the allow-list host {host!r} does not resolve here "
                                                   f"({exc}); k8s pods get the addresses it resolves to") from exc
            resolved[host] = sorted({str(i[4][0]) for i in infos}, key=lambda a: (":" in a, a))
        label = pods.network_label(network, resolved)
        if (target.key, label) not in self._made:
            await self._create(target, pods.allow_list_policy(label, network, resolved, self.metadata))
            self._made.add((target.key, label))
        return resolved

    async def _create(self, target: Target, body: dict[str, Any]) -> None:
        try:
            await self._call(target.context, "create network policy", lambda c: _networking(c)
                             .create_namespaced_network_policy(target.namespace, body, _preload_content=False))
        except ProviderError as exc:
            if exc.code != "AlreadyExists":
                raise


__all__ = ["EgressPolicies"]
