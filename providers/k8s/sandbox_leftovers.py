"""A crashed coordinator's agent-sandbox warm pools, for ``flowmesh gc``.

:meth:`.agent_sandbox.AgentSandbox.ensure_pool` makes a SandboxTemplate and a SandboxWarmPool of
one name per warm shape, both labelled with the pool's tags as :data:`.pods.TAGS` encodes them
(``flowmesh.io/fleet``, ``flowmesh.io/pool``, ``flowmesh.io/owner``, ``flowmesh.io/run``; not the
request's), and deletes them at close.  A coordinator that dies leaves them, and the controller
keeps ``replicas`` warm pods running.  Those pods are no instances (``list_tagged`` skips
unclaimed warm-pool members), so gc asks here; the provider lists and deletes, gc decides:

* :meth:`WarmPoolLeftovers.scan`: in every target whose context serves the CRDs, the
  SandboxWarmPools the label selector ``flowmesh.io/fleet`` (``=<fleet>`` for one fleet) finds,
  as :class:`~flowmesh_sdk.provider.Leftover` records (``kind="SandboxWarmPool"``, ``machine``
  the target's ``context/namespace``, the pool's uid and name, its decoded owner, fleet, pool
  and run tags, its age from ``creationTimestamp``).  Left out: those this provider made and
  still holds, and those being deleted (``deletionTimestamp``).
* :meth:`WarmPoolLeftovers.remove`: deletes each warm pool and its template (the controller
  deletes the unclaimed sandboxes and their pods), then lists again: what is still listed
  (and not being deleted) is still there.

Every call goes through the provider's call wrapper (off the loop on its bounded workers, the
API's errors mapped onto the SDK's: :mod:`.api`).  A context whose discovery fails, or a namespace
whose list or delete fails, is ``unreachable`` (what it holds stays; gc says so).  A namespace
where the credentials may not list warm pools (RBAC: ``AuthError``) is skipped with a warning:
this identity made none there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from flowmesh_sdk.errors import AuthError, FlowMeshError, NotFoundError
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_RUN, Leftover, LeftoverScan

from . import pods
from .agent_sandbox import AgentSandbox
from .config import Target
from .errors import PROVIDER

log = logging.getLogger("flowmesh.providers.k8s")
KIND = "SandboxWarmPool"


def selector(fleet: str | None) -> str:
    """The label selector of the SDK's warm pools (one fleet's, when given)."""
    (key, value), = pods.TAGS.encode({TAG_FLEET: fleet or "x"}).items()
    return f"{key}={value}" if fleet is not None else key


def leftover_of(target: Target, pool: Mapping[str, Any], now: float) -> Leftover:
    meta = pool.get("metadata") or {}
    tags = pods.TAGS.decode(meta.get("labels") or {})
    made = pods.timestamp(meta.get("creationTimestamp"))   # as a pod's launched_at
    return Leftover(target.key, "", str(meta.get("uid") or ""), str(meta.get("name") or ""),
                    tags.get(TAG_FLEET, ""), tags.get(TAG_POOL, ""), kind=KIND, owner=tags.get(TAG_OWNER, ""),
                    run=tags.get(TAG_RUN, ""), age_s=max(0.0, now - made) if made else 0.0)


class WarmPoolLeftovers:
    """The k8s provider's :meth:`leftovers` and :meth:`remove_leftovers` (module docstring).
    ``targets()``: the provider's (context, namespace) targets."""

    def __init__(self, agent: AgentSandbox, targets: Callable[[], Awaitable[Sequence[Target]]]) -> None:
        self._agent = agent
        self._targets = targets

    async def _served(self, unreachable: list[tuple[str, str]]) -> list[Target]:
        """The targets whose context serves agent-sandbox (a context whose discovery failed
        goes to ``unreachable``)."""
        targets = list(await self._targets())
        out = []
        for ctx in sorted({t.context for t in targets}):
            support = await self._agent.support(ctx)
            if support.failed:
                unreachable.append((ctx, support.reason))
            elif support.served:
                out += [t for t in targets if t.context == ctx]
        return out

    async def _list(self, target: Target, label_selector: str,
                    unreachable: list[tuple[str, str]]) -> list[dict[str, Any]] | None:
        """The namespace's labelled warm pools not being deleted (None: it could not be asked)."""
        try:
            got = await self._agent.warm_pools(target, label_selector)
        except NotFoundError:
            return []           # the CRDs went since discovery
        except AuthError as exc:
            log.warning("k8s: cannot list SandboxWarmPools in %s (%s); gc skips that namespace", target.key, exc)
            return None
        except FlowMeshError as exc:
            unreachable.append((target.key, f"{type(exc).__name__}: {exc}"))
            return None
        return [p for p in got if not (p.get("metadata") or {}).get("deletionTimestamp")]

    async def scan(self, fleet: str | None = None) -> LeftoverScan:
        unreachable: list[tuple[str, str]] = []
        found: list[Leftover] = []
        now = time.time()
        for target in await self._served(unreachable):
            listed = await self._list(target, selector(fleet), unreachable)
            for pool in listed or ():
                lo = leftover_of(target, pool, now)
                if not self._agent.made(target, lo.container_name):
                    found.append(lo)
        return LeftoverScan(PROVIDER, tuple(found), tuple(unreachable))

    async def remove(self, scan: LeftoverScan) -> LeftoverScan:
        """Delete the warm pools (and templates) ``scan`` found; returns those still there
        and the namespaces that did not answer."""
        by_key = {t.key: t for t in await self._targets()}
        by_machine: dict[str, list[Leftover]] = {}
        still: list[Leftover] = []
        for lo in scan.found:
            if lo.kind == KIND:
                by_machine.setdefault(lo.machine, []).append(lo)
            else:
                still.append(lo)
        unreachable: list[tuple[str, str]] = []
        for key, items in sorted(by_machine.items()):
            target = by_key.get(key)
            if target is None:
                unreachable.append((key, "no longer a target of this provider"))
                still += items
                continue
            try:
                for lo in items:
                    await self._agent.delete_pool(target, lo.container_name)
            except FlowMeshError as exc:
                unreachable.append((key, f"{type(exc).__name__}: {exc}"))
                still += items
                continue
            listed = await self._list(target, selector(None), unreachable)
            there = {str((p.get("metadata") or {}).get("uid")) for p in listed} if listed is not None else None
            still += [lo for lo in items if there is None or lo.container_id in there]
        return LeftoverScan(PROVIDER, tuple(still), tuple(unreachable))


__all__ = ["KIND", "WarmPoolLeftovers", "leftover_of", "selector"]
