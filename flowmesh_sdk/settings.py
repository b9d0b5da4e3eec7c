"""One configuration: every setting the SDK reads, from three places, with one precedence.

    argument  >  environment variable  >  config file  >  default

* the **config file** is TOML: ``$FLOWMESH_CONFIG`` if set, else ``flowmesh.toml`` in
  ``$FLOWMESH_HOME`` (else in the default home, ``$XDG_STATE_HOME/flowmesh`` or
  ``~/.local/state/flowmesh``).  Keys are the dotted names below, as TOML tables::

      home = "/var/lib/flowmesh"
      state = "redis://127.0.0.1:6379/0"
      [catalog]
      max_age_days = 14
      [providers.ec2]
      endpoint_url = "http://127.0.0.1:5000"
      image_id = "ami-0123456789abcdef0"
      [providers.ssh]
      inventory = "/etc/flowmesh/hosts.json"

  The providers read their settings (endpoints, AMIs, projects, inventories, keys) from
  here whenever the matching constructor argument is not given.
* **environment variables**: each setting names its own (``FLOWMESH_HOME``,
  ``FLOWMESH_EC2_ENDPOINT_URL``, the clouds' usual ``VAST_API_KEY``, ...).
* an **argument** is what the caller passed (a keyword, a CLI option): ``resolve(key, arg)``.

``flowmesh config show`` prints the effective value of each setting and where it came
from; secrets are shown as ``***``, and so is the password of any URL in a value (the
``state`` URL's, an endpoint's: :func:`flowmesh_sdk.redaction.redact_url`).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import backends, collector
from .descriptor import Setting
from .errors import SpecError
from .redaction import REDACTED, redact_url

CONFIG_ENV = "FLOWMESH_CONFIG"
CONFIG_NAME = "flowmesh.toml"


def _default_home() -> str:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return str(Path(base) / "flowmesh")


def _default_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return str(Path(base) / "flowmesh")


#: the SDK's own settings; each provider's (``providers.<name>.*``) are in its descriptor
SETTINGS: tuple[Setting, ...] = (
    Setting("home", ("FLOWMESH_HOME",), default=_default_home,
            help="state directory: the metadata store, local instances, the CAS"),
    Setting("state", ("FLOWMESH_STATE",),
            help="shared control state, e.g. redis://[:password@]host:port/db (default: in-process); its password is "
                 "a secret, shown as ***"),
    Setting("cache_dir", ("FLOWMESH_CACHE_DIR",), default=_default_cache,
            help="cache directory (refreshed price catalogs under catalog/)"),
    Setting("catalog.max_age_days", ("FLOWMESH_CATALOG_MAX_AGE_DAYS",), float, lambda: 30.0,
            help="a price catalog older than this is stale"),
    Setting("coordinator.gc_threshold", ("FLOWMESH_GC_THRESHOLD",), default=lambda: collector.DEFAULT,
            help="the garbage collector's thresholds while a fleet is open, at least these ('A,B,C'), or 'off' "
                 "(flowmesh_sdk.collector)"),
    Setting("log.level", ("FLOWMESH_LOG_LEVEL",), help="the CLI's log level (debug, info, warning, ...)"),
    Setting("log.json", ("FLOWMESH_LOG_JSON",), bool, lambda: False, help="the CLI logs JSON lines"),
)


def all_settings() -> tuple[Setting, ...]:
    """The SDK's settings, then every installed provider's."""
    return (*SETTINGS, *backends.provider_settings())


def by_key() -> Mapping[str, Setting]:
    return {s.key: s for s in all_settings()}


@dataclass(frozen=True, slots=True)
class Resolved:
    key: str
    value: Any
    source: str            # "argument", "env NAME", "file PATH", "default" or "unset"
    secret: bool = False

    @property
    def safe(self) -> Any:
        """The value as it may be shown: a secret as ``***``; in a text, every URL's
        password as ``***`` (``redis://:***@host:6379/0``); None when unset."""
        if self.value is None:
            return None
        if self.secret:
            return REDACTED
        return redact_url(self.value) if isinstance(self.value, str) else self.value

    @property
    def shown(self) -> str:
        return "-" if self.value is None else str(self.safe)


def config_path() -> Path:
    """The config file this process reads (it need not exist)."""
    named = os.environ.get(CONFIG_ENV)
    if named:
        return Path(named).expanduser()
    home = os.environ.get("FLOWMESH_HOME") or _default_home()
    return Path(home).expanduser() / CONFIG_NAME


_cache: dict[str, tuple[float, dict[str, Any]]] = {}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def file_values(path: Path | None = None) -> dict[str, Any]:
    """The config file's keys, flattened to dotted names ({} when there is no file)."""
    p = path or config_path()
    try:
        mtime = p.stat().st_mtime
    except OSError:
        if path is None and os.environ.get(CONFIG_ENV):
            raise SpecError(CONFIG_ENV, f"{p} does not exist") from None
        return {}
    hit = _cache.get(str(p))
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        data = _flatten(tomllib.loads(p.read_text()))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError("config", f"{p}: not a readable TOML file: {exc}") from exc
    _cache[str(p)] = (mtime, data)
    return data


def _convert(s: Setting, raw: Any, where: str) -> Any:
    try:
        if s.kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if s.kind in (int, float):
            if isinstance(raw, bool):
                raise ValueError(raw)
            return s.kind(raw)
        if not isinstance(raw, (str, int, float)):
            raise ValueError(raw)
        return str(raw)
    except (TypeError, ValueError):
        allowed = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[s.kind]
        shown = REDACTED if s.secret else repr(redact_url(raw) if isinstance(raw, str) else raw)
        raise SpecError(s.key, f"{where}: must be {allowed}, got {shown}") from None


def resolve(key: str, argument: Any = None) -> Resolved:
    """The effective value of ``key``: ``argument`` if not None, else the first of its
    environment variables that is set (and not empty), else the config file, else the
    default (None when it has none)."""
    known = by_key()
    s = known.get(key)
    if s is None:
        raise SpecError("setting", f"unknown setting {key!r}; known: {', '.join(known)}")
    if argument is not None:
        return Resolved(key, _convert(s, argument, "argument"), "argument", s.secret)
    for var in s.env:
        text = os.environ.get(var)
        if text:
            return Resolved(key, _convert(s, text, f"${var}"), f"env {var}", s.secret)
    values = file_values()
    if key in values:
        return Resolved(key, _convert(s, values[key], str(config_path())), f"file {config_path()}", s.secret)
    if s.default is not None:
        return Resolved(key, s.default(), "default", s.secret)
    return Resolved(key, None, "unset", s.secret)


def value(key: str, argument: Any = None) -> Any:
    """``resolve(key, argument).value``."""
    return resolve(key, argument).value


def effective() -> list[Resolved]:
    """Every known setting, then the file's unknown keys (source ``file ... (unknown key)``)."""
    known = by_key()
    rows = [resolve(key) for key in known]
    for key, raw in sorted(file_values().items()):
        if key not in known:
            secret = any(w in key.lower() for w in ("key", "secret", "password", "token"))
            rows.append(Resolved(key, raw, f"file {config_path()} (unknown key, ignored)", secret))
    return rows
