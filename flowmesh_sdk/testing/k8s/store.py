"""The object store: one global resourceVersion counter (as etcd's revision), an event
history and watch fan-out.  As the watch cache (``cacheWatcher``) does, an object that stops
matching a watch's selectors is sent to it as DELETED, one that starts matching as ADDED.

Everything here runs on the emulator's event loop (nothing locks)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .meta import ApiError, Obj, now_rfc3339
from .selectors import FieldSelector, LabelSelector

__all__ = ["Event", "ObjectStore", "Watcher"]


@dataclass
class Event:
    rv: int
    type: str                   # ADDED, MODIFIED, DELETED
    resource: str               # "pods", "networkpolicies.networking.k8s.io", ...
    namespace: str
    obj: Obj                    # the object as of this event (DELETED: its last state, new rv)
    prev: Obj | None            # MODIFIED: the object before


@dataclass(eq=False)
class Watcher:
    """One watch stream's subscription: events queue up here as they happen."""

    resource: str
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)

    def _passes(self, obj: Obj) -> bool:
        return self.labels.matches((obj.get("metadata") or {}).get("labels")) and self.fields.matches(obj)

    def offer(self, ev: Event) -> None:
        if ev.resource != self.resource or (self.namespace is not None and ev.namespace != self.namespace):
            return
        now = self._passes(ev.obj)
        if ev.type == "MODIFIED" and ev.prev is not None:
            before = self._passes(ev.prev)
            if now and not before:
                self.queue.put_nowait(("ADDED", ev.obj))
            elif before and not now:
                gone = copy.deepcopy(ev.prev)
                gone["metadata"]["resourceVersion"] = str(ev.rv)
                self.queue.put_nowait(("DELETED", gone))
            elif now:
                self.queue.put_nowait(("MODIFIED", ev.obj))
        elif now:
            self.queue.put_nowait((ev.type, ev.obj))


class ObjectStore:
    """Objects by resource, namespace and name; every write takes the next resourceVersion
    of one global counter (as etcd's revision) and is recorded for watches.  ``history``
    events are kept; a watch from before the oldest kept one is too old (410)."""

    def __init__(self, history: int = 10000) -> None:
        self.rv = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._history: deque[Event] = deque(maxlen=history)
        self._compacted = 0          # the newest resourceVersion no longer in the history
        self._watchers: set[Watcher] = set()
        self.on_change: list[Callable[[Event], None]] = []

    # ---- writes ----------------------------------------------------------------------
    def _emit(self, ev: Event) -> None:
        if self._history.maxlen and len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].rv
        self._history.append(ev)
        for w in list(self._watchers):
            w.offer(ev)
        for fn in list(self.on_change):
            fn(ev)

    def create(self, resource: str, obj: Obj) -> Obj:
        """Store a new object: uid, resourceVersion and creationTimestamp are set here."""
        meta = obj.setdefault("metadata", {})
        key = (str(meta.get("namespace", "")), str(meta["name"]))
        bucket = self._objects.setdefault(resource, {})
        if key in bucket:
            raise ApiError.already_exists(resource.split(".", 1)[0], key[1], _group(resource))
        self.rv += 1
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = str(self.rv)
        meta["creationTimestamp"] = now_rfc3339()
        bucket[key] = obj
        self._emit(Event(self.rv, "ADDED", resource, key[0], copy.deepcopy(obj), None))
        return copy.deepcopy(obj)

    def update(self, resource: str, namespace: str, name: str, mutate: Callable[[Obj], None],
               *, uid: str | None = None) -> Obj | None:
        """Apply ``mutate`` to the object (in place); a change takes a new resourceVersion and
        is sent as MODIFIED.  None if the object is gone (or is another one than ``uid``)."""
        obj = self._objects.get(resource, {}).get((namespace, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return None
        before = copy.deepcopy(obj)
        mutate(obj)
        obj["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"]
        obj["metadata"]["creationTimestamp"] = before["metadata"]["creationTimestamp"]
        if obj == before:
            return copy.deepcopy(obj)
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(Event(self.rv, "MODIFIED", resource, namespace, copy.deepcopy(obj), before))
        return copy.deepcopy(obj)

    def delete(self, resource: str, namespace: str, name: str, *, uid: str | None = None) -> Obj | None:
        bucket = self._objects.get(resource, {})
        obj = bucket.get((namespace, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return None
        del bucket[(namespace, name)]
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(Event(self.rv, "DELETED", resource, namespace, copy.deepcopy(obj), None))
        return copy.deepcopy(obj)

    # ---- reads -----------------------------------------------------------------------
    def get(self, resource: str, namespace: str, name: str) -> Obj:
        obj = self._objects.get(resource, {}).get((namespace, name))
        if obj is None:
            raise ApiError.not_found(resource.split(".", 1)[0], name, _group(resource))
        return copy.deepcopy(obj)

    def peek(self, resource: str, namespace: str, name: str) -> Obj | None:
        """The stored object itself (not a copy; do not change it), or None."""
        return self._objects.get(resource, {}).get((namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """The stored objects (not copies), sorted by namespace and name as etcd keys are."""
        bucket = self._objects.get(resource, {})
        return [bucket[k] for k in sorted(bucket) if namespace is None or k[0] == namespace]

    def list(self, resource: str, namespace: str | None, labels: LabelSelector, fields: FieldSelector,
             limit: int = 0, cont: str = "") -> tuple[list[Obj], Obj]:
        """Matching objects (copies) and the list's metadata (resourceVersion, continue,
        remainingItemCount).  A continue token resumes after the last key it names."""
        start = ""
        if cont:
            try:
                token = json.loads(base64.urlsafe_b64decode(cont + "=" * (-len(cont) % 4)))
                start = str(token["start"])
            except (ValueError, KeyError, TypeError):
                raise ApiError.bad_request("continue key is not valid: incorrect encoded start resourceVersion "
                                           "(version meta.k8s.io/v1)") from None
        matched = []
        for obj in self.items(resource, namespace):
            meta = obj["metadata"]
            key = f"{meta.get('namespace', '')}/{meta['name']}"
            if start and key <= start:
                continue
            if labels.matches(meta.get("labels")) and fields.matches(obj):
                matched.append(obj)
        meta_out: Obj = {"resourceVersion": str(self.rv)}
        if limit and len(matched) > limit:
            last = matched[limit - 1]["metadata"]
            token = {"v": "meta.k8s.io/v1", "rv": self.rv,
                     "start": f"{last.get('namespace', '')}/{last['name']}"}
            meta_out["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")
            if not labels.requirements and not fields.terms:
                meta_out["remainingItemCount"] = len(matched) - limit
            matched = matched[:limit]
        return [copy.deepcopy(o) for o in matched], meta_out

    # ---- watches ---------------------------------------------------------------------
    def watch(self, resource: str, namespace: str | None, labels: LabelSelector, fields: FieldSelector,
              since: int | None) -> Watcher:
        """Subscribe; ``since`` None: the current objects first (as ADDED), else the events
        after that resourceVersion (ApiError 410 Expired if it is older than the history)."""
        w = Watcher(resource, namespace, labels, fields)
        if since is None:
            for obj in self.items(resource, namespace):
                if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj):
                    w.queue.put_nowait(("ADDED", copy.deepcopy(obj)))
        else:
            if since < self._compacted:
                raise ApiError(410, "Expired", f"too old resource version: {since} ({self._compacted})")
            for ev in self._history:
                if ev.rv > since:
                    w.offer(ev)
        self._watchers.add(w)
        return w

    def unwatch(self, w: Watcher) -> None:
        self._watchers.discard(w)

    def compact(self) -> int:
        """Forget the event history (as an etcd compaction): a watch from an older
        resourceVersion is answered 410.  Returns the resourceVersion compacted to."""
        self._history.clear()
        self._compacted = self.rv
        return self.rv


def _group(resource: str) -> str:
    return resource.split(".", 1)[1] if "." in resource else ""
