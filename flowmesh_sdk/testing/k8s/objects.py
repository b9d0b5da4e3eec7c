"""The emulator's API objects: ``v1 Status`` errors, quantities, label and field selectors,
the object store (one global resourceVersion counter, an event history, watch fan-out) and
ResourceQuota accounting.

Everything here runs on the emulator's event loop (nothing locks): the HTTP handlers and
the kubelet mutate the store, and every change is handed at once to the watchers whose
namespace and selectors it concerns.

Sources: ``k8s.io/apimachinery/pkg/api/errors`` (Status bodies: ``pods "x" not found``,
``pods "x" already exists``, ``NewResourceExpired`` for a too old watch), ``.../api/resource``
(quantity suffixes and their canonical form), ``.../labels/selector.go`` (selector syntax),
the watch cache (``cacheWatcher``: an object that stops matching a watch's selectors is sent
to it as DELETED, one that starts matching as ADDED) and the ResourceQuota admission plugin
(``k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go``: ``exceeded quota: Q,
requested: ..., used: ..., limited: ...`` and ``failed quota: Q: must specify ...``).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

__all__ = ["ApiError", "FieldSelector", "LabelSelector", "ObjectStore", "Watcher", "format_quantity",
           "match_label_selector", "now_rfc3339", "parse_quantity", "pod_requests", "quota_admit",
           "quota_used", "status_body"]

Obj = dict[str, Any]


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---- errors ---------------------------------------------------------------------------
def status_body(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> Obj:
    """A ``v1 Status`` as the apiserver writes an error."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                 "message": message, "reason": reason}
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


class ApiError(Exception):
    """An API error answered as a ``v1 Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Mapping[str, Any] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = dict(headers or {})

    def body(self) -> Obj:
        return status_body(self.code, self.reason, self.message, self.details)

    @classmethod
    def not_found(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(404, "NotFound", f'{what} "{name}" not found', details)

    @classmethod
    def already_exists(cls, resource: str, name: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(409, "AlreadyExists", f'{what} "{name}" already exists', details)

    @classmethod
    def forbidden(cls, resource: str, name: str, why: str, group: str = "") -> ApiError:
        what = f"{resource}.{group}" if group else resource
        details: Obj = {"name": name, "kind": resource}
        if group:
            details["group"] = group
        return cls(403, "Forbidden", f'{what} "{name}" is forbidden: {why}', details)

    @classmethod
    def invalid(cls, kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
        """422 Invalid; ``causes``: (field, message) pairs as field.ErrorList renders them."""
        text = ", ".join(f"{f}: {m}" for f, m in causes)
        lead = f"{kind}.{group}" if group else kind
        message = f'{lead} "{name}" is invalid: ' + (f"[{text}]" if len(causes) > 1 else text)
        details: Obj = {"name": name, "kind": kind,
                        "causes": [{"reason": _cause_reason(m), "message": m, "field": f} for f, m in causes]}
        if group:
            details["group"] = group
        return cls(422, "Invalid", message, details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)


def _cause_reason(message: str) -> str:
    for prefix, reason in (("Required value", "FieldValueRequired"), ("Invalid value", "FieldValueInvalid"),
                           ("Unsupported value", "FieldValueNotSupported"), ("Forbidden", "FieldValueForbidden"),
                           ("Too many", "FieldValueTooMany"), ("Duplicate value", "FieldValueDuplicate")):
        if message.startswith(prefix):
            return reason
    return "FieldValueInvalid"


# ---- names ------------------------------------------------------------------------------
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_HELP = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                  "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                  "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
LABEL_HELP = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
              "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
              "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")


def name_errors(name: str, *, label: bool = False) -> list[str]:
    """``metadata.name`` problems (apimachinery's IsDNS1123Subdomain / IsDNS1123Label)."""
    limit = 63 if label else 253
    out = []
    if len(name) > limit:
        out.append(f"must be no more than {limit} characters")
    if not (_DNS1123_LABEL if label else _DNS1123_SUBDOMAIN).match(name):
        out.append(LABEL_HELP if label else SUBDOMAIN_HELP)
    return out


_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"   # apiserver's utilrand alphanumerics


def generate_name(base: str) -> str:
    import secrets
    return base[:58] + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))


# ---- quantities ---------------------------------------------------------------------------
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity (``500m``, ``2``, ``0.5``, ``512Mi``, ``1G``, ``1e3``) as an exact number."""
    text = str(value).strip()
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$' (got {text!r})")
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return number * 1024 ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * Fraction(10) ** _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def _is_binary(value: str | int | float) -> bool:
    return str(value).strip()[-2:] in _BINARY


def format_quantity(value: Fraction, *, binary: bool = False) -> str:
    """The canonical form the apiserver prints (``Quantity.String()``): binary suffixes for a
    quantity given with one (when a whole multiple of 1024), else the largest decimal SI
    suffix that keeps the number whole (``0.5`` -> ``500m``, ``2000`` -> ``2k``)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    value = abs(value)
    if binary and value >= 1024 and value.denominator == 1:
        n = int(value)
        best = ""
        for suffix, power in _BINARY.items():
            if n % 1024 ** power == 0:
                best = suffix
        if best:
            return f"{sign}{n // 1024 ** _BINARY[best]}{best}"
    for suffix, exp in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
        scaled = value / Fraction(10) ** exp
        if scaled.denominator == 1:
            return f"{sign}{int(scaled)}{suffix}"
    # finer than a nano: rounded up to nanos, as the apiserver does
    nanos = -(-value * 10 ** 9 // 1)
    return f"{sign}{int(nanos)}n"


# ---- label selectors ------------------------------------------------------------------------
_REQ = re.compile(r"^\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(?:(==|=|!=|>|<)\s*([-A-Za-z0-9_.]*)"
                  r"|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str                  # =, !=, in, notin, exists, !, gt, lt
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if not has:
            return False
        try:
            number, bound = int(str(value)), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == "gt" else number < bound


def _split_top(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


class LabelSelector:
    """``labelSelector`` of a list or watch: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``,
    ``k notin (a,b)``, ``k``, ``!k``, ``k>1``, ``k<1``; a comma is AND."""

    def __init__(self, text: str = "") -> None:
        self.text = text
        self.requirements: list[_Requirement] = []
        if not text.strip():
            return
        for part in _split_top(text):
            m = _REQ.match(part)
            if not m or (m.group(1) and (m.group(3) or m.group(5))):
                raise ApiError.bad_request(f"unable to parse requirement: found '{part.strip()}', expected: "
                                           "identifier, '=', '==', '!=', 'in', 'notin', '!', '>' or '<'")
            neg, key, op, value, setop, setvals = m.groups()
            if neg:
                self.requirements.append(_Requirement(key, "!", ()))
            elif op:
                kind = {"==": "=", "=": "=", "!=": "!=", ">": "gt", "<": "lt"}[op]
                self.requirements.append(_Requirement(key, kind, (value,)))
            elif setop:
                vals = tuple(v.strip() for v in setvals.split(",") if v.strip())
                self.requirements.append(_Requirement(key, setop, vals))
            else:
                self.requirements.append(_Requirement(key, "exists", ()))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def match_label_selector(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """A ``metav1.LabelSelector`` object (``matchLabels``, ``matchExpressions``); an empty
    one selects everything."""
    labels = labels or {}
    if not selector:
        return True
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), tuple(expr.get("values") or ())
        kind = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}.get(op)
        if kind is None or not _Requirement(key, kind, values).matches(labels):
            return False
    return True


# ---- field selectors --------------------------------------------------------------------------
FieldGetter = Callable[[Obj], Mapping[str, str]]


def common_fields(obj: Obj) -> dict[str, str]:
    meta = obj.get("metadata") or {}
    out = {"metadata.name": str(meta.get("name", ""))}
    if "namespace" in meta:
        out["metadata.namespace"] = str(meta["namespace"])
    return out


def pod_fields(obj: Obj) -> dict[str, str]:
    """The pod fields the apiserver can select on (``pkg/registry/core/pod/strategy.go``)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    out = common_fields(obj)
    out.update({"spec.nodeName": str(spec.get("nodeName", "")),
                "spec.restartPolicy": str(spec.get("restartPolicy", "")),
                "spec.schedulerName": str(spec.get("schedulerName", "")),
                "spec.serviceAccountName": str(spec.get("serviceAccountName", "")),
                "spec.hostNetwork": str(bool(spec.get("hostNetwork", False))).lower(),
                "status.phase": str(status.get("phase", "")),
                "status.podIP": str(status.get("podIP", "")),
                "status.nominatedNodeName": str(status.get("nominatedNodeName", ""))})
    return out


class FieldSelector:
    """``fieldSelector``: ``f=v``, ``f==v``, ``f!=v`` joined by commas (AND)."""

    def __init__(self, text: str, fields: FieldGetter) -> None:
        self.text = text
        self.fields = fields
        self.terms: list[tuple[str, bool, str]] = []   # (field, equal, value)
        if not text.strip():
            return
        for part in text.split(","):
            m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
            if not m:
                raise ApiError.bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
            self.terms.append((m.group(1), m.group(2) != "!=", m.group(3)))

    def check(self, sample: Obj) -> None:
        known = self.fields(sample)
        for name, _, _ in self.terms:
            if name not in known and name not in ("metadata.namespace",):
                raise ApiError.bad_request(f"field label not supported: {name}")

    def matches(self, obj: Obj) -> bool:
        if not self.terms:
            return True
        values = self.fields(obj)
        return all((values.get(name, "") == value) == equal for name, equal, value in self.terms)


# ---- the store --------------------------------------------------------------------------------
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


# ---- quota ----------------------------------------------------------------------------------
TERMINAL = ("Succeeded", "Failed")
_COMPUTE = ("cpu", "memory")


def pod_requests(pod: Obj, kind: str = "requests") -> dict[str, Fraction]:
    """Sum of the containers' ``resources.requests`` (or ``limits``)."""
    out: dict[str, Fraction] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        for k, v in ((c.get("resources") or {}).get(kind) or {}).items():
            out[k] = out.get(k, Fraction(0)) + parse_quantity(v)
    return out


def _binary_keys(pod: Obj) -> set[str]:
    keys = set()
    for c in (pod.get("spec") or {}).get("containers") or []:
        for kind in ("requests", "limits"):
            for k, v in ((c.get("resources") or {}).get(kind) or {}).items():
                if _is_binary(v):
                    keys.update({f"{kind}.{k}", k})
    return keys


def pod_quota_usage(pod: Obj) -> dict[str, Fraction]:
    """What a pod counts against a ResourceQuota (the pod evaluator's ``Usage``)."""
    usage: dict[str, Fraction] = {"pods": Fraction(1), "count/pods": Fraction(1)}
    for k, v in pod_requests(pod, "requests").items():
        usage[f"requests.{k}"] = v
        if k in _COMPUTE:
            usage[k] = v
    for k, v in pod_requests(pod, "limits").items():
        if k in _COMPUTE:
            usage[f"limits.{k}"] = v
    return usage


def counts_for_quota(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in TERMINAL


def quota_used(quota: Obj, pods: Iterable[Obj]) -> dict[str, str]:
    """``status.used`` of a quota: the keys of its ``spec.hard`` summed over its namespace's
    non-terminated pods."""
    hard = ((quota.get("spec") or {}).get("hard") or {})
    totals = {k: Fraction(0) for k in hard}
    binary = {k for k, v in hard.items() if _is_binary(v)}
    for pod in pods:
        if not counts_for_quota(pod):
            continue
        binary |= _binary_keys(pod)
        for k, v in pod_quota_usage(pod).items():
            if k in totals:
                totals[k] += v
    return {k: format_quantity(v, binary=k in binary) for k, v in totals.items()}


def quota_admit(pod: Obj, quotas: Iterable[Obj], pods: Iterable[Obj]) -> None:
    """The ResourceQuota admission check for a new pod; raises ApiError 403 as the plugin
    words it."""
    name = pod["metadata"]["name"]
    pods = [p for p in pods if counts_for_quota(p)]
    usage = pod_quota_usage(pod)
    binary = _binary_keys(pod)
    for quota in quotas:
        qname = quota["metadata"]["name"]
        hard = ((quota.get("spec") or {}).get("hard") or {})
        # cpu and memory quotas need every container to state the resource (podEvaluator.Constraints)
        missing: dict[str, set[str]] = {}
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            for key in hard:
                kind, _, what = key.rpartition(".")
                if what not in _COMPUTE or kind not in ("", "requests", "limits"):
                    continue
                where = "limits" if kind == "limits" else "requests"
                if what not in (res.get(where) or {}):
                    missing.setdefault(key, set()).add(str(c.get("name", "")))
        if missing:
            parts = [f"{k} for: {','.join(sorted(v))}" for k, v in sorted(missing.items())]
            raise ApiError.forbidden("pods", name, f"failed quota: {qname}: must specify {'; '.join(parts)}")
        used = {k: Fraction(0) for k in hard}
        q_binary = {k for k, v in hard.items() if _is_binary(v)} | binary
        for p in pods:
            q_binary |= _binary_keys(p)
            for k, v in pod_quota_usage(p).items():
                if k in used:
                    used[k] += v
        failed = sorted(k for k in hard if k in usage and used[k] + usage[k] > parse_quantity(hard[k]))
        if failed:
            def show(values: Mapping[str, Fraction]) -> str:
                return ",".join(f"{k}={format_quantity(values[k], binary=k in q_binary)}" for k in failed)
            limits = {k: parse_quantity(hard[k]) for k in failed}
            raise ApiError.forbidden("pods", name, f"exceeded quota: {qname}, requested: {show(usage)}, "
                                                    f"used: {show(used)}, limited: {show(limits)}")
