"""The checks every record runs on its fields: each raises
:class:`~flowmesh_sdk.errors.SpecError` naming the field, the value given and what is allowed."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType

from ..errors import SpecError

# validated with fullmatch: ``re.match`` with ``$`` lets a trailing newline through
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}", re.ASCII)
ISOLATIONS = ("strict", "shared")   # strict: a fresh instance; shared: a fresh container on a warm one


def check_number(field_name: str, value: object, *, lo: float, hi: float | None = None,
                 lo_open: bool = False, integer: bool = False) -> None:
    """Raise SpecError unless ``value`` is a number in the allowed range."""
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            integer and not isinstance(value, int)):
        raise SpecError(field_name, f"must be {kind}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(field_name, f"must be finite, got {value!r}")
    low_ok = value > lo if lo_open else value >= lo
    if not low_ok or (hi is not None and value > hi):
        bracket = "(" if lo_open else "["
        upper = f"{hi:g}]" if hi is not None else "inf)"
        raise SpecError(field_name, f"must be in {bracket}{lo:g}, {upper}, got {value!r}")


def check_choice(field_name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError(field_name, f"must be one of {', '.join(allowed)}; got {value!r}")


def check_name(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise SpecError(field_name, "must be 1-40 chars of lowercase letters, digits and '-', "
                                    f"starting with a letter or digit; got {value!r}")


def frozen_env(field_name: str, env: Mapping[str, str] | None) -> Mapping[str, str]:
    """Validate an environment mapping and return a read-only copy."""
    if env is None:
        env = {}
    if not isinstance(env, Mapping):
        raise SpecError(field_name, f"must be a mapping of NAME -> value (e.g. {{'PATH': '/bin'}}), "
                                    f"got {type(env).__name__}")
    out: dict[str, str] = {}
    for key, val in env.items():
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise SpecError(f"{field_name}[{key!r}]",
                            "keys must match [A-Za-z_][A-Za-z0-9_]*")
        if not isinstance(val, str) or "\x00" in val:
            raise SpecError(f"{field_name}[{key}]", "values must be strings without NUL bytes")
        out[key] = val
    return MappingProxyType(out)
