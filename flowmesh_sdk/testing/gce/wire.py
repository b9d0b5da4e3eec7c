"""The Compute Engine emulator's wire: error bodies, operations, bulkInsert bodies and list
filters as Compute Engine reads and writes them (see the package docstring for sources)."""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..httpserver import json_response

API = "https://www.googleapis.com/compute/v1"
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")   # a resource name (RFC 1035)
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")

# (name, vCPUs, memory MiB, accelerator type or None, accelerator count)
DEFAULT_MACHINE_TYPES: tuple[tuple[str, int, int, str | None, int], ...] = (
    ("e2-standard-2", 2, 8192, None, 0),
    ("e2-standard-4", 4, 16384, None, 0),
    ("e2-standard-8", 8, 32768, None, 0),
    ("n2-standard-2", 2, 8192, None, 0),
    ("n2-standard-4", 4, 16384, None, 0),
    ("n2-standard-8", 8, 32768, None, 0),
    ("n2-standard-16", 16, 65536, None, 0),
    ("g2-standard-4", 4, 16384, "nvidia-l4", 1),
    ("a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1),
)


@dataclass
class Op:
    name: str
    id: str
    zone: str
    kind: str                       # bulkInsert, delete
    target: str
    created: float
    done_at: float | None           # monotonic; None: never
    apply: Any = None               # called once when done: returns error entries or []
    errors: list[dict[str, str]] = field(default_factory=list)
    http_status: int = 0
    applied: bool = False
    inserted: str = field(default_factory=lambda: now_iso())   # stamped once, as Compute Engine does
    ended: str | None = None
    group: str | None = None        # bulkInsert: its operationGroupId
    target_id: str | None = None    # the instance's id (insert, delete)

    def done(self, now: float) -> bool:
        return self.done_at is not None and now >= self.done_at


@dataclass
class Fault:
    method: str
    status: int
    reason: str
    message: str
    times: int | None


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def error_body_of(status: int, reason: str, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message,
                      "errors": [{"message": message, "domain": "global", "reason": reason}]}}


def error(status: int, reason: str, message: str) -> web.Response:
    return json_response(status, error_body_of(status, reason, message))


def bulk_request(body: Any) -> tuple[int, int, str | None, list[str], dict[str, Any]] | str:
    """A bulkInsert body as Compute Engine reads it: (count, minCount, namePattern, the names of
    ``perInstanceProperties``, instanceProperties), or the 400 message naming the field."""
    if not isinstance(body, dict):
        return "Invalid value for the request body: it must be a JSON object."
    props = body.get("instanceProperties")
    if not isinstance(props, dict) or not props.get("machineType"):
        return "Invalid value for field 'resource.instanceProperties.machineType': ''. A machine type is required."
    named = body.get("perInstanceProperties") or {}
    if not isinstance(named, dict):
        return "Invalid value for field 'resource.perInstanceProperties': it must map instance names to properties."
    pattern = body.get("namePattern")
    if pattern is not None and (not isinstance(pattern, str) or pattern.count("#") < 1
                                or "#" * pattern.count("#") not in pattern):
        return (f"Invalid value for field 'resource.namePattern': '{pattern}'. The pattern must contain one run "
                "of '#' characters.")
    try:
        count = int(body.get("count") or len(named))
        min_count = int(body.get("minCount") or count)
    except (TypeError, ValueError):
        return f"Invalid value for field 'resource.count': '{body.get('count')}'. It must be an integer."
    if not 1 <= min_count <= count <= 1000:
        return (f"Invalid value for field 'resource.count': '{count}'. It must be between 1 and 1000, and at least "
                f"minCount ({min_count}).")
    if pattern is None and len(named) < count:
        return ("Invalid value for field 'resource.namePattern': ''. A name pattern is required when "
                "perInstanceProperties names fewer instances than count.")
    return count, min_count, pattern, list(named), dict(props)


# ---- list filters -------------------------------------------------------------------
_TOKEN = re.compile(r'\s*(?:(\()|(\))|(AND|OR)\b|([A-Za-z_][\w.]*)\s*(!=|=|:)\s*("(?:[^"\\]|\\.)*"|[^\s()]+))')


def parse_filter(text: str) -> list[Any]:
    """Tokens of a Compute Engine list filter: '(', ')', 'AND', 'OR', or (field, op, value)."""
    out: list[Any] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError(f"Invalid list filter expression near {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group(1):
            out.append("(")
        elif m.group(2):
            out.append(")")
        elif m.group(3):
            out.append(m.group(3))
        else:
            value = m.group(6)
            if value.startswith('"'):
                value = json.loads(value)
            out.append((m.group(4), m.group(5), value))
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _field(inst: Mapping[str, Any], name: str) -> str | None:
    if name.startswith("labels."):
        return (inst.get("labels") or {}).get(name[7:])
    value = inst.get(name)
    return None if value is None else str(value)


def matches(tokens: list[Any], inst: Mapping[str, Any]) -> bool:
    pos = 0

    def term() -> bool:
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            value = expr()
            pos += 1   # ')'
            return value
        name, op, want = tok
        have = _field(inst, name)
        if op == ":":
            return have is not None if want == "*" else have is not None and want in have
        if op == "=":
            return have == want
        return have != want

    def expr() -> bool:
        nonlocal pos
        value = term()
        while pos < len(tokens) and tokens[pos] != ")":
            op = tokens[pos]
            if op in ("AND", "OR"):
                pos += 1
            else:
                op = "AND"   # juxtaposition is AND
            rhs = term()
            value = (value and rhs) if op == "AND" else (value or rhs)
        return value

    return True if not tokens else expr()
