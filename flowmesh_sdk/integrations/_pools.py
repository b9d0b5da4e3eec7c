"""Pools named by a config file, for the integrations a framework constructs itself.

verl builds its tools from a tool-config YAML (``class_name`` + ``config``), Harbor builds
its environments from an import path and keyword arguments: neither hands them a pool the
user made.  Their ``pool`` setting is therefore either

* the name of a pool registered in this process with :func:`register_pool` (a pool the
  user's own code made: an async ``Pool`` or a ``flowmesh_sdk.sync`` ``SyncPool``), or
* a mapping of :class:`~flowmesh_sdk.specs.PoolSpec` fields (``instance`` and
  ``sandbox_size`` as mappings of their own), with an optional ``fleet`` mapping
  (``name``, ``home``, ``state``, ``provider_options``): the pool then belongs to a fleet
  this module owns, one per fleet setting per process, on a private event loop in a
  background thread (:class:`~flowmesh_sdk.sync.SyncFleet`), shared by every tool or
  environment naming the same pool, and closed by :func:`close_shared_fleets`, when an
  ``asyncio.run`` that asked for it ends (:func:`close_with_running_loop`), or at
  interpreter exit (best effort: Python >= 3.12 starts no thread then, and a fleet's close
  needs some; what is left is an orphan for ``flowmesh gc``).

Callers reach the pool through :class:`PoolHandle`: its coroutines run on the pool's loop
(:class:`~._bridge.LoopBridge`), so the framework's own loop never blocks.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import FlowMeshError, SpecError
from ..pools.base import Pool
from ..sandbox import Sandbox
from ..specs import InstanceSpec, PoolSpec, SandboxSize, SandboxSpec
from ..sync import SyncFleet, SyncPool
from ._bridge import LoopBridge

__all__ = ["PoolHandle", "SandboxLease", "close_shared_fleets", "close_with_running_loop", "pool_spec_from_config",
           "register_pool",
           "resolve_pool", "sandbox_spec_from_config", "unregister_pool"]

_FLEET_KEYS = ("name", "home", "state", "provider_options")
_lock = threading.Lock()
_registered: dict[str, PoolHandle] = {}
_fleets: dict[str, SyncFleet] = {}
_made: dict[tuple[str, str], tuple[PoolSpec, PoolHandle]] = {}
_keepers: dict[asyncio.AbstractEventLoop, asyncio.Task[None]] = {}
log = logging.getLogger("flowmesh.integrations")


@dataclass(frozen=True)
class PoolHandle:
    """A pool and the loop it runs on."""

    pool: Pool
    bridge: LoopBridge

    @property
    def name(self) -> str:
        return self.pool.spec.name

    async def open(self, spec: SandboxSpec, *, tenant: str, name: str | None = None) -> SandboxLease:
        """Take a sandbox of ``spec`` (warm if the pool has one) until the lease is closed."""
        return await self.bridge.hop(self._open(spec, tenant, name))

    async def _open(self, spec: SandboxSpec, tenant: str, name: str | None) -> SandboxLease:
        stack = contextlib.AsyncExitStack()
        try:
            sb = await stack.enter_async_context(self.pool.sandbox(spec, tenant=tenant, name=name))
        except BaseException:
            await stack.aclose()
            raise
        return SandboxLease(sb, self.bridge, stack)


@dataclass
class SandboxLease:
    """One sandbox held open across calls; :meth:`close` destroys it and frees its slot."""

    sandbox: Sandbox
    bridge: LoopBridge
    _stack: contextlib.AsyncExitStack | None

    @property
    def closed(self) -> bool:
        return self._stack is None

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            with contextlib.suppress(FlowMeshError):   # a lost sandbox is gone already
                await self.bridge.hop(stack.aclose())


def register_pool(name: str, pool: Pool | SyncPool) -> None:
    """Make ``pool`` the one a config's ``pool: NAME`` means in this process.  An async pool
    must be registered in async code on its loop; a ``SyncPool`` from anywhere."""
    if not isinstance(name, str) or not name:
        raise SpecError("register_pool.name", f"must be a non-empty string, got {name!r}")
    inner = pool.pool if isinstance(pool, SyncPool) else pool
    if not isinstance(inner, Pool):
        raise SpecError("register_pool.pool", f"must be a FlowMesh Pool or SyncPool, got {type(pool).__name__}")
    with _lock:
        _registered[name] = PoolHandle(inner, LoopBridge.of(pool))


def unregister_pool(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def _from_fields(cls: type, data: Mapping[str, Any], field: str) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(field, f"must be a mapping of {cls.__name__} fields, got {type(data).__name__}")
    allowed = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in allowed:
            raise SpecError(f"{field}.{key}", f"is not a {cls.__name__} field; allowed: {', '.join(allowed)}")
        out[key] = tuple(value) if isinstance(value, list) else value
    return out


def pool_spec_from_config(data: Mapping[str, Any], *, field: str = "pool") -> PoolSpec:
    """A :class:`PoolSpec` from a mapping of its fields (``fleet`` left out)."""
    kw = _from_fields(PoolSpec, {k: v for k, v in data.items() if k != "fleet"}, field)
    if "name" not in kw:
        raise SpecError(f"{field}.name", "is required: the pool's name (shared by every user of the same name)")
    if isinstance(kw.get("instance"), Mapping):
        kw["instance"] = InstanceSpec(**_from_fields(InstanceSpec, kw["instance"], f"{field}.instance"))
    if isinstance(kw.get("sandbox_size"), Mapping):
        kw["sandbox_size"] = SandboxSize(**_from_fields(SandboxSize, kw["sandbox_size"], f"{field}.sandbox_size"))
    return PoolSpec(**kw)


def sandbox_spec_from_config(data: Mapping[str, Any] | None, *, image: str, field: str) -> SandboxSpec:
    """A :class:`SandboxSpec` of ``image`` from a mapping of its other fields."""
    kw = _from_fields(SandboxSpec, data or {}, field)
    if "image" in kw:
        raise SpecError(f"{field}.image", "is set by the image setting, not here")
    return SandboxSpec(image=image, **kw)


def _fleet_key(data: Mapping[str, Any], field: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(data, Mapping):
        raise SpecError(field, f"must be a mapping of {', '.join(_FLEET_KEYS)}, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FLEET_KEYS))
    if unknown:
        raise SpecError(f"{field}.{unknown[0]}", f"is not a fleet setting; allowed: {', '.join(_FLEET_KEYS)}")
    kw = {"name": "integrations", **data}
    return json.dumps(kw, sort_keys=True, default=str), kw


def resolve_pool(ref: str | Mapping[str, Any], *, field: str = "pool") -> PoolHandle:
    """The pool a config's ``pool`` setting names (see the module docstring).  Call it from
    any thread; a mapping's pool is made (and its fleet started) on first use."""
    if isinstance(ref, str):
        with _lock:
            handle = _registered.get(ref)
        if handle is None:
            raise SpecError(field, f"no pool is registered as {ref!r} in this process "
                                   f"(registered: {', '.join(sorted(_registered)) or 'none'}); register one "
                                   "with flowmesh_sdk.integrations.register_pool, or give a mapping of PoolSpec fields")
        return handle
    if not isinstance(ref, Mapping):
        raise SpecError(field, f"must be a registered pool's name or a mapping of PoolSpec fields, got {ref!r}")
    spec = pool_spec_from_config(ref, field=field)
    key, fleet_kw = _fleet_key(ref.get("fleet") or {}, f"{field}.fleet")
    with _lock:
        made = _made.get((key, spec.name))
        if made is not None:
            if made[0] != spec:
                raise SpecError(f"{field}.name", f"pool {spec.name!r} is already open here with other settings; "
                                                 "give this one another name")
            return made[1]
        fleet = _fleets.get(key)
        if fleet is None:
            fleet = _fleets[key] = SyncFleet(**fleet_kw)
        sync_pool = fleet.pool(spec)
        handle = PoolHandle(sync_pool.pool, LoopBridge.of(sync_pool))
        _made[(key, spec.name)] = (spec, handle)
        return handle


def close_shared_fleets(timeout_s: float | None = 60.0) -> None:
    """Drain and close every fleet :func:`resolve_pool` started (their sandboxes and
    instances go); the next :func:`resolve_pool` starts afresh.  Blocking: call it from a
    thread that is not a fleet's loop (it also runs at interpreter exit)."""
    with _lock:
        fleets = list(_fleets.values())
        _fleets.clear()
        _made.clear()
    for fleet in fleets:
        fleet.close(timeout_s)


def close_with_running_loop() -> None:
    """Close the shared fleets when the running loop's ``asyncio.run`` ends: a task that
    waits for ever, cancelled there with the loop's other tasks, closes them (in a worker
    thread) while the loop and its executor still run.  For a framework whose whole run is
    one ``asyncio.run`` (Harbor's CLI, its jobs and trials)."""
    loop = asyncio.get_running_loop()
    with _lock:
        if loop in _keepers:
            return
        _keepers[loop] = loop.create_task(_close_when_cancelled(loop), name="flowmesh-close-shared-fleets")


async def _close_when_cancelled(loop: asyncio.AbstractEventLoop) -> None:
    try:
        await loop.create_future()
    finally:
        with _lock:
            _keepers.pop(loop, None)
            last = not _keepers
        if last:
            await asyncio.to_thread(close_shared_fleets)


def _close_at_exit() -> None:
    try:
        close_shared_fleets()
    except RuntimeError as exc:     # Python >= 3.12 starts no thread at shutdown; the fleets' closes do
        log.warning("could not close the integrations' fleets at exit (%s): their instances are orphans "
                    "for `flowmesh gc`; call flowmesh_sdk.integrations.close_shared_fleets() before exit", exc)


# Interpreter exit: before concurrent.futures shuts its executors down (threading's own exit
# hooks run before ``atexit``'s, last registered first), as the fleets' stores still use theirs.
getattr(threading, "_register_atexit", atexit.register)(_close_at_exit)
