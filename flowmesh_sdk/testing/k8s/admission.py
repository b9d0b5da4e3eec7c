"""Admission and validation of the objects clients create: defaults, names, labels, pod
specs, quota specs and secrets, with the apiserver's messages (``k8s.io/apimachinery/pkg/util/
validation`` for names and labels, ``pkg/apis/core/validation`` for pods and their
tolerations (:mod:`.taints`), the DefaultTolerationSeconds plugin's tolerations) -- and RFC 7386 merge patches."""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

from .objects import ApiError, Obj, name_errors, parse_quantity
from .taints import toleration_errors

__all__ = ["DEFAULT_TOLERATIONS", "DOCKER_CONFIG_JSON", "default_pod", "merge_patch", "same_quantity",
           "validate_labels", "validate_pod", "validate_quota", "validate_secret"]

_LABEL_VALUE_HELP = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                     "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
_LABEL_NAME_HELP = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
DEFAULT_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]


def validate_labels(kind: str, group: str, name: str, meta: Obj) -> None:
    """``metadata.labels`` as apimachinery validates them (422 Invalid)."""
    causes = []
    value_re = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    name_re = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        raise ApiError.bad_request("metadata.labels must be an object of strings")
    for k, v in labels.items():
        prefix, _, part = str(k).rpartition("/")
        if not name_re.match(part) or len(part) > 63 or (prefix and name_errors(prefix)):
            causes.append(("metadata.labels", f'Invalid value: "{k}": {_LABEL_NAME_HELP}'))
        if not isinstance(v, str) or len(v) > 63 or not value_re.match(v):
            causes.append(("metadata.labels", f'Invalid value: "{v}": {_LABEL_VALUE_HELP}'
                           if isinstance(v, str) and len(v) <= 63 else
                           f'Invalid value: "{v}": must be no more than 63 characters'))
    if causes:
        raise ApiError.invalid(kind, name, causes, group)


def default_pod(pod: Obj) -> None:
    """The defaults the apiserver (and its admission plugins) set on a new pod."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("priority", 0)
    tolerations = spec.setdefault("tolerations", [])
    for t in DEFAULT_TOLERATIONS:
        if not any(x.get("key") == t["key"] and x.get("effect") == t["effect"] for x in tolerations):
            tolerations.append(dict(t))
    qos_parts = []
    for c in spec.get("containers") or []:
        if not isinstance(c, dict):
            continue
        image = str(c.get("image", ""))
        last = image.rsplit("/", 1)[-1]
        latest = "@" not in image and (":" not in last or last.endswith(":latest"))
        c.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        resources = c.setdefault("resources", {})
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for k, v in limits.items():
            requests.setdefault(k, v)
        if requests:
            resources["requests"] = requests
        qos_parts.append((requests, limits))
    status = pod.setdefault("status", {})
    status.clear()
    status["phase"] = "Pending"
    if all(not r and not lim for r, lim in qos_parts):
        status["qosClass"] = "BestEffort"
    elif all(lim.get(k) and same_quantity(r.get(k), lim.get(k)) for r, lim in qos_parts for k in ("cpu", "memory")):
        status["qosClass"] = "Guaranteed"
    else:
        status["qosClass"] = "Burstable"


def validate_pod(pod: Obj) -> None:
    """Pod validation (422 Invalid with field.ErrorList's messages), and the emulator's
    limits: one container, no init or ephemeral containers."""
    name = pod["metadata"]["name"]
    spec = pod["spec"]
    causes: list[tuple[str, str]] = []
    containers = spec.get("containers")
    if not containers or not isinstance(containers, list):
        causes.append(("spec.containers", "Required value"))
        containers = []
    elif len(containers) > 1:
        causes.append(("spec.containers", f"Too many: {len(containers)}: must have at most 1 items "
                                          "(the k8s emulator runs one container per pod)"))
    for fieldname in ("initContainers", "ephemeralContainers"):
        if spec.get(fieldname):
            causes.append((f"spec.{fieldname}", "Forbidden: the k8s emulator runs no init or ephemeral "
                                                "containers"))
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        causes.append(("spec.restartPolicy", f'Unsupported value: "{spec.get("restartPolicy")}": supported '
                                             'values: "Always", "OnFailure", "Never"'))
    for i, c in enumerate(containers):
        where = f"spec.containers[{i}]"
        if not isinstance(c, dict):
            causes.append((where, "Invalid value: must be an object"))
            continue
        cname = str(c.get("name") or "")
        if not cname:
            causes.append((f"{where}.name", "Required value"))
        else:
            for p in name_errors(cname, label=True):
                causes.append((f"{where}.name", f'Invalid value: "{cname}": {p}'))
        if not c.get("image"):
            causes.append((f"{where}.image", "Required value"))
        resources = c.get("resources") or {}
        parsed: dict[str, dict[str, Any]] = {}
        for kind in ("requests", "limits"):
            for k, v in (resources.get(kind) or {}).items():
                try:
                    parsed.setdefault(kind, {})[k] = parse_quantity(v)
                except ValueError as exc:
                    causes.append((f"{where}.resources.{kind}[{k}]", f'Invalid value: "{v}": {exc}'))
        req, lim = parsed.get("requests", {}), parsed.get("limits", {})
        for k, v in req.items():
            if k in lim and v > lim[k] and k in ("cpu", "memory", "ephemeral-storage"):
                causes.append((f"{where}.resources.requests",
                               f'Invalid value: "{resources["requests"][k]}": must be less than or equal to '
                               f'{k} limit of {resources["limits"][k]}'))
            if "/" in k and "kubernetes.io/" not in k:
                if k not in lim:
                    causes.append((f"{where}.resources.limits",
                                   "Required value: Limit must be set for non overcommitable resources"))
                elif lim[k] != v:
                    causes.append((f"{where}.resources.requests[{k}]",
                                   f'Invalid value: "{resources["requests"][k]}": must be equal to {k} limit '
                                   f'of {resources["limits"][k]}'))
    causes += toleration_errors(spec.get("tolerations"))
    if causes:
        raise ApiError.invalid("Pod", name, causes)


def validate_quota(quota: Obj) -> None:
    name = quota["metadata"]["name"]
    causes = []
    for k, v in ((quota.get("spec") or {}).get("hard") or {}).items():
        try:
            parse_quantity(v)
        except ValueError as exc:
            causes.append((f"spec.hard[{k}]", f'Invalid value: "{v}": {exc}'))
    if causes:
        raise ApiError.invalid("ResourceQuota", name, causes)


_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
DOCKER_CONFIG_JSON = ".dockerconfigjson"


def validate_secret(secret: Obj) -> None:
    """A Secret as the apiserver admits it: ``stringData`` merged into ``data`` (base64) and
    dropped, ``data`` base64 with valid keys, ``type`` defaulted to ``Opaque``; a
    ``kubernetes.io/dockerconfigjson`` one needs ``data[.dockerconfigjson]``, well-formed JSON."""
    name = secret["metadata"]["name"]
    data = secret.get("data") or {}
    if not isinstance(data, dict):
        raise ApiError.bad_request("Secret in version \"v1\" cannot be handled as a Secret: data must be an object")
    for k, v in data.items():
        try:
            base64.b64decode(str(v), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ApiError.bad_request(f'Secret in version "v1" cannot be handled as a Secret: illegal base64 '
                                       f'data in data[{k}]: {exc}') from None
    for k, v in (secret.pop("stringData", None) or {}).items():
        data[k] = base64.b64encode(str(v).encode()).decode()
    secret["data"] = data
    secret.setdefault("type", "Opaque")
    causes = [(f"data[{k}]", f'Invalid value: "{k}": a valid config key must consist of alphanumeric '
                             "characters, '-', '_' or '.'") for k in data if not _SECRET_KEY.fullmatch(k)]
    if secret["type"] == "kubernetes.io/dockerconfigjson":
        if DOCKER_CONFIG_JSON not in data:
            causes.append((f"data[{DOCKER_CONFIG_JSON}]", "Required value"))
        else:
            try:
                json.loads(base64.b64decode(data[DOCKER_CONFIG_JSON]))
            except ValueError as exc:
                causes.append((f"data[{DOCKER_CONFIG_JSON}]", f'Invalid value: "<secret contents redacted>": {exc}'))
    if causes:
        raise ApiError.invalid("Secret", name, causes)


def same_quantity(a: Any, b: Any) -> bool:
    try:
        return a is not None and b is not None and parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return False


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge_patch(target.get(k), v)
    return target
