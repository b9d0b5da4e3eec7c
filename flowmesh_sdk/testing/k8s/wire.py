"""What the API's handlers (:mod:`.api`, :mod:`.writes`, :mod:`.subresources`) share: the
request tally with the throttle switch (:class:`Tally`, behind :meth:`KubeEmulator.count`
and :meth:`KubeEmulator.throttle`), a request's JSON body and selectors, an object as it
goes out, and the 404/405 answers."""

from __future__ import annotations

import copy
import json
from collections import Counter

from aiohttp import web

from .objects import ApiError, FieldSelector, LabelSelector, Obj, ObjectStore, common_fields, pod_fields, quota_used
from .resources import Resource, event_fields

__all__ = ["Tally", "no_route", "not_allowed", "present", "read_body", "selectors"]

_TOO_MANY = "Too many requests, please try again later."   # the apiserver's max-in-flight / APF answer


class Tally:
    """Requests served per ``(verb, resource)``, and the throttle: the next ``n`` requests
    counted answer 429 (see :meth:`KubeEmulator.throttle`)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._throttle = 0
        self._retry_after = 1
        self._throttle_plain = False

    def throttle(self, n: int, retry_after: int = 1, *, plain: bool = False) -> None:
        self._throttle, self._retry_after, self._throttle_plain = n, retry_after, plain

    def record(self, verb: str, resource: str) -> None:
        """Count a request; while throttled, raise its 429."""
        self.counts[(verb, resource)] += 1
        if self._throttle > 0:
            self._throttle -= 1
            headers = {"Retry-After": str(self._retry_after)}
            if self._throttle_plain:
                raise web.HTTPTooManyRequests(text=_TOO_MANY + "\n", headers=headers)
            raise ApiError(429, "TooManyRequests", _TOO_MANY, {"retryAfterSeconds": self._retry_after}, headers)


def no_route() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {})


async def read_body(request: web.Request) -> Obj:
    raw = await request.read()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError.bad_request(f"the object provided is unrecognized (must be of type JSON): {exc}") from None
    if not isinstance(body, dict):
        raise ApiError.bad_request("the object provided is not a JSON object")
    return body


def selectors(request: web.Request, res: Resource) -> tuple[LabelSelector, FieldSelector]:
    q = request.query
    fields = pod_fields if res.name == "pods" else (event_fields if res.name == "events" else common_fields)
    labels = LabelSelector(q.get("labelSelector", ""))
    sel = FieldSelector(q.get("fieldSelector", ""), fields)
    sample: Obj = {"metadata": {"name": "", "namespace": ""}, "spec": {}, "status": {}}
    sel.check(sample)
    return labels, sel


def present(store: ObjectStore, res: Resource, obj: Obj, *, item: bool = False) -> Obj:
    """An object as it goes out: kind/apiVersion (not on list items), computed status."""
    out = copy.deepcopy(obj)
    if res.name == "resourcequotas":
        hard = (out.get("spec") or {}).get("hard") or {}
        pods = store.items("pods", out["metadata"].get("namespace"))
        out["status"] = {"hard": dict(hard), "used": quota_used(out, pods)}
    if item:
        out.pop("kind", None)
        out.pop("apiVersion", None)
    else:
        out = {"kind": res.kind, "apiVersion": res.api_version, **out}
    return out
