"""Finding and reclaiming what the SDK left behind (a crashed coordinator's instances,
containers and providers' leftovers), by the tags and labels every launch carries.

An instance is an orphan when its ``flowmesh:owner`` process is gone (owners on this
host are checked directly), or, for owners elsewhere, when it is older than
``older_than_s``; ``include_live`` takes every instance regardless.  A container is an
orphan when its owner process is gone, or its instance is an orphan, or it has no
owner on this host and its instance no longer exists.  A container whose owner is
running is never taken without ``include_live``.  Termination is
confirmed by ``describe`` before an instance counts as reclaimed.

Only what this home owns is touched.  Instances come from the providers given (the local
provider keeps its instances under ``FLOWMESH_HOME``); a container is a candidate only when
its instance is one of those providers' instances or one this home's metadata store has
recorded (``known_instances``), so the containers of another ``FLOWMESH_HOME`` on the same
machine -- whose instances this home never launched -- are left alone, whoever their owner.
``fleet`` narrows both to one fleet, ``run`` to one run of a fleet (``Fleet(run=...)``: the
``flowmesh:run`` tag, the ``flowmesh.run`` label); naming the run also takes what its
coordinators on other hosts left (an owner this host cannot check), never what a live
owner or, on a shared fleet, a live coordinator holds.  :func:`execute` records each confirmed termination
in the metadata store it is given (``INSTANCE_TERMINATED``), so ``flowmesh status`` no
longer lists what gc removed.

With ``leftovers=True`` :func:`plan` also asks each provider what it finds outside its
instances (:meth:`Provider.leftovers`: :class:`~flowmesh_sdk.provider.Leftover` records, and the
machines it could not reach) and decides which to take; :func:`execute` has the provider remove
those (:meth:`Provider.remove_leftovers`).  A leftover container without an owner (``ssh``
frees the slice of an instance whose machine did not answer at termination and remembers its
containers) is taken once its machine answers.  A leftover with an owner (a crashed
coordinator's agent-sandbox ``SandboxWarmPool`` on ``k8s``) is taken by the rules of an
instance: its owner gone, or, for an owner this host cannot check, ``run`` naming its run or
``older_than_s`` reached; a live owner's only with ``include_live``.  ``fleet`` and ``run``
apply to it as to an instance.

On a shared fleet, :func:`plan` is given what Redis says (``shared``): an instance a live
coordinator holds -- one it adopted from a dead coordinator included -- is never taken
without ``include_live``, whatever its owner tag says; one whose holder has no lease is.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from .config import Owner
from .errors import FlowMeshError
from .control.backend import InProcessBackend
from .control.events import Event, EventKind
from .control.shared import SharedHolders, SharedInstance
from .control.store import MetadataStore
from .provider import (LABEL_FLEET, LABEL_INSTANCE, LABEL_OWNER, LABEL_RUN, TAG_FLEET, TAG_OWNER, TAG_POOL,
                       TAG_RUN, Leftover, LeftoverScan, Provider)
from .provisioning import Provisioner
from .remote.runtime import ContainerInfo, ContainerRuntime


log = logging.getLogger("flowmesh.gc")


@dataclass(frozen=True, slots=True)
class Orphan:
    provider: str
    instance_id: str
    pool: str
    owner: str
    age_s: float
    reason: str
    fleet: str = ""
    #: where its provider lists it ("" for an adopted one: the shared state keeps no region)
    region: str = ""


@dataclass(frozen=True, slots=True)
class Unreachable:
    """A machine gc could not ask (its leftovers stay until it answers)."""

    provider: str
    machine: str
    why: str


@dataclass(frozen=True, slots=True)
class GcPlan:
    instances: tuple[Orphan, ...]
    containers: tuple[ContainerInfo, ...]
    #: per provider, what terminate left on machines that did not answer then
    leftovers: tuple[LeftoverScan, ...] = ()

    @property
    def found_leftovers(self) -> tuple[tuple[str, Leftover], ...]:
        """(provider, leftover) of every leftover gc takes (``Leftover.kind`` says what it is)."""
        return tuple((scan.provider, lo) for scan in self.leftovers for lo in scan.found)

    @property
    def unreachable(self) -> tuple[Unreachable, ...]:
        return tuple(Unreachable(scan.provider, m, why) for scan in self.leftovers for m, why in scan.unreachable)


@dataclass(frozen=True, slots=True)
class GcResult:
    terminated: tuple[str, ...]
    still_present: tuple[str, ...]
    containers_removed: tuple[str, ...]
    #: leftovers removed (their names: containers from machines that answered again, warm pools)
    leftovers_removed: tuple[str, ...] = ()
    #: machines that did not answer: what they hold stays
    unreachable: tuple[Unreachable, ...] = ()
    #: the records of the leftovers removed (``leftovers_removed``, with their kind)
    swept: tuple[Leftover, ...] = ()


def _owner_gone(owner_text: str) -> tuple[bool | None, str]:
    owner = Owner.parse(owner_text)
    if owner is None:
        return None, "no owner tag"
    alive = owner.alive()
    if alive is None:
        return None, f"owner on {owner.host}"
    return (not alive), ("owner process exited" if not alive else "owner running")


def _taken(gone: bool | None, why: str, age_s: float, *, run: str | None, older_than_s: float | None,
           include_live: bool, held: bool = False) -> str | None:
    """Why gc takes something with this owner verdict (``_owner_gone``), or None: its owner
    is gone; an owner this host cannot check (and no live shared coordinator ``held`` it) with
    ``run`` named or ``older_than_s`` reached; anything with ``include_live``."""
    if gone is True:
        return why
    if gone is None and not held and run is not None:
        return f"{why}, of run {run}"
    if gone is None and not held and older_than_s is not None and age_s >= older_than_s:
        return f"{why}, older than {older_than_s:g} s"
    if include_live:
        return f"{why}, --all"
    return None


def _leftover_taken(lo: Leftover, *, fleet: str | None, run: str | None, older_than_s: float | None,
                    include_live: bool) -> str | None:
    """Why gc takes the leftover ``lo``, or None (module docstring)."""
    if fleet is not None and lo.fleet != fleet:
        return None
    if lo.kind == "container" and not lo.owner:   # ssh: the remains of an instance terminated already
        return f"instance {lo.instance_id} on {lo.machine}, terminated while {lo.machine} did not answer"
    if run is not None and lo.run != run:
        return None
    gone, why = _owner_gone(lo.owner)
    return _taken(gone, why, lo.age_s, run=run, older_than_s=older_than_s, include_live=include_live)


async def _scan(prov: Provider, *, fleet: str | None, run: str | None, older_than_s: float | None,
                include_live: bool) -> LeftoverScan:
    """``prov``'s leftovers, only those gc takes (each with its ``reason``)."""
    scan = await prov.leftovers(fleet)
    taken = []
    for lo in scan.found:
        why = _leftover_taken(lo, fleet=fleet, run=run, older_than_s=older_than_s, include_live=include_live)
        if why is not None:
            taken.append(replace(lo, reason=why))
    return replace(scan, found=tuple(taken))


async def plan(providers: Sequence[Provider], runtime: ContainerRuntime | None, *,
               older_than_s: float | None = None, include_live: bool = False,
               known_instances: Iterable[str] = (), fleet: str | None = None,
               shared: SharedHolders | None = None, leftovers: bool = False, run: str | None = None) -> GcPlan:
    """What is left behind.  ``known_instances``: ids of instances this home launched
    (its metadata store's records); with ``providers``' own listings they decide which
    containers are this home's.  ``fleet``: only that fleet's instances and containers.
    ``shared``: a shared fleet's state -- an instance a live coordinator holds is never
    taken (one adopted from a dead coordinator included) and one whose holder's lease
    lapsed is, whatever its owner tag says.  ``leftovers``: also ask each provider what it
    finds outside its instances (this contacts the machines that did not answer at their
    termination) and take what the module docstring says."""
    now = time.time()
    orphans: list[Orphan] = []
    live_ids: set[str] = set()
    held: set[str] = set()        # a live coordinator of the shared fleet holds them
    listed_by_id = {i.id: i for i in shared.instances} if shared is not None else {}
    for prov in providers:
        for inst in await prov.list_tagged({}):
            live_ids.add(inst.id)
            if fleet is not None and inst.tags.get(TAG_FLEET, "") != fleet:
                continue
            if run is not None and inst.tags.get(TAG_RUN, "") != run:
                continue
            owner = inst.tags.get(TAG_OWNER, "")
            gone, why = _owner_gone(owner)
            listed = listed_by_id.get(inst.id)
            if shared is not None and listed is not None:
                gone, why = ((None, f"held by live coordinator {listed.holder}") if listed.holder in shared.live
                             else (True, f"its coordinator {listed.holder or '?'} is gone (no lease)"))
            if listed is not None and gone is None:
                held.add(inst.id)
            age = max(0.0, now - inst.launched_at)
            reason = _taken(gone, why, age, run=run, older_than_s=older_than_s, include_live=include_live,
                            held=inst.id in held)
            if reason is None:
                continue
            orphans.append(Orphan(prov.name, inst.id, inst.tags.get(TAG_POOL, ""), owner, age, reason,
                                  inst.tags.get(TAG_FLEET, ""), inst.region))
    containers: list[ContainerInfo] = []
    if runtime is not None:
        orphan_ids = {o.instance_id for o in orphans}
        ours = live_ids | set(known_instances)
        for c in await runtime.list(label_keys=[LABEL_FLEET]):
            inst_id = c.labels.get(LABEL_INSTANCE, "")
            if inst_id not in ours:
                continue        # another home's (or nobody's we know): not ours to take
            if fleet is not None and c.labels.get(LABEL_FLEET, "") != fleet:
                continue
            if run is not None and c.labels.get(LABEL_RUN, "") != run:
                continue
            if inst_id in held and not include_live:
                continue
            gone, _ = _owner_gone(c.labels.get(LABEL_OWNER, ""))
            if (include_live or gone is True or inst_id in orphan_ids
                    or (gone is None and inst_id not in live_ids)):
                containers.append(c)
    scans = []
    for prov in providers if leftovers else ():
        scan = await _scan(prov, fleet=fleet, run=run, older_than_s=older_than_s, include_live=include_live)
        if scan:
            scans.append(scan)
    return GcPlan(tuple(orphans), tuple(containers), tuple(scans))


async def plan_adopted(insts: Sequence[SharedInstance], dead: str, provider: Callable[[str], Provider]
                       ) -> tuple[GcPlan, list[Provider]]:
    """What an adopter can reclaim, from here, of the instances it adopted from the dead
    coordinator ``dead`` (``provider(name)`` loads one), and the providers to ask.  An
    instance of a provider whose machines are slices of one host (``local``) is left out
    unless it is this host's and this home's (its provider describes it); so is one whose
    provider cannot be loaded here -- each with a warning."""
    here, orphans, provs = socket.gethostname(), [], {}
    for i in insts:
        try:
            prov = provider(i.provider)
        except FlowMeshError as exc:
            log.warning("cannot reclaim instance %s of dead coordinator %s: %s", i.id, dead, exc)
            continue
        if not prov.capabilities.remote and ((i.host and i.host != here) or not await prov.describe([i.id])):
            log.warning("instance %s of dead coordinator %s is a slice of host %s, not visible from here: "
                        "run `flowmesh gc` there", i.id, dead, i.host or "?")
            continue
        provs[prov.name] = prov
        orphans.append(Orphan(prov.name, i.id, i.pool, dead, 0.0,
                              f"its coordinator {dead} died; reclaimed by its adopter", i.fleet))
    return GcPlan(tuple(orphans), ()), list(provs.values())


async def execute(gc_plan: GcPlan, providers: Sequence[Provider], runtime: ContainerRuntime | None,
                  *, progress: Callable[[str], None] | None = None,
                  provisioner: Provisioner | None = None,
                  store: MetadataStore | None = None,
                  record: Callable[[Event], None] | None = None) -> GcResult:
    """Terminate and remove what ``gc_plan`` lists; through ``provisioner`` (its rate limits
    and retries) when given, else one with the in-process backend.  Each termination
    ``describe`` confirms is recorded in ``store`` (when given) before this returns, and
    handed to ``record`` (a fleet's bus, a shared fleet's stream)."""
    calls = provisioner or Provisioner(InProcessBackend())
    by_provider = {p.name: p for p in providers}
    terminated: list[str] = []
    still: list[str] = []
    places: dict[tuple[str, str], list[str]] = {}
    for o in gc_plan.instances:
        if o.provider in by_provider:
            places.setdefault((o.provider, o.region), []).append(o.instance_id)
    for (name, region), ids in places.items():
        # the one terminate (until confirmed); "*": a region the plan does not know (adopted)
        remaining = await calls.terminate(by_provider[name], region or "*", ids, label="gc")
        for i in ids:
            (still if i in remaining else terminated).append(i)
            if progress:
                progress(i)
    done = set(terminated)
    for o in gc_plan.instances:
        if o.instance_id in done:
            ev = Event(EventKind.INSTANCE_TERMINATED, fleet=o.fleet, pool=o.pool,
                       instance_id=o.instance_id, detail=f"terminated by gc: {o.reason}")
            if store is not None:
                store.record(ev)
            if record is not None:
                record(ev)
    if store is not None and terminated:
        await store.flush()
    removed: list[str] = []
    if runtime is not None and gc_plan.containers:
        ids = [c.id for c in gc_plan.containers]
        await runtime.remove(ids)
        left = {c.id for c in await runtime.list(label_keys=[LABEL_FLEET])}
        removed = [i for i in ids if i not in left]
        if progress:
            for c in gc_plan.containers:
                progress(c.name)
    swept: list[Leftover] = []
    unreachable: list[Unreachable] = []
    for scan in gc_plan.leftovers:
        prov = by_provider.get(scan.provider)
        if prov is None:
            continue
        after = await prov.remove_leftovers(scan)
        kept = {(lo.kind, lo.machine, lo.container_id) for lo in after.found}
        swept += [lo for lo in scan.found if (lo.kind, lo.machine, lo.container_id) not in kept]
        unreachable += [Unreachable(scan.provider, m, why) for m, why in after.unreachable]
        if progress:
            for lo in scan.found:
                progress(lo.container_name)
    return GcResult(tuple(terminated), tuple(still), tuple(removed), tuple(lo.container_name for lo in swept),
                    tuple(unreachable), tuple(swept))
