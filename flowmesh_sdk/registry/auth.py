"""Registry credentials, from the environment or the user's podman/docker auth files
(never logged).

Looked up, first match wins:

1. ``FLOWMESH_REGISTRY_AUTH_<HOST>`` = ``user:password``, where ``<HOST>`` is the registry
   host (with port) upper-cased and every character but letters and digits replaced by
   ``_`` (``127.0.0.1:5000`` -> ``FLOWMESH_REGISTRY_AUTH_127_0_0_1_5000``);
2. the auth files ``$REGISTRY_AUTH_FILE``, ``$XDG_RUNTIME_DIR/containers/auth.json``,
   ``~/.config/containers/auth.json``, ``~/.docker/config.json``, each holding
   ``{"auths": {"HOST": {"auth": base64("user:password")}}}``.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)

    def basic_header(self) -> str:
        raw = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(raw).decode()

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, password=***)"


def auth_files() -> list[Path]:
    out = []
    if os.environ.get("REGISTRY_AUTH_FILE"):
        out.append(Path(os.environ["REGISTRY_AUTH_FILE"]))
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(Path(os.environ["XDG_RUNTIME_DIR"]) / "containers" / "auth.json")
    home = Path(os.path.expanduser("~"))
    out += [home / ".config" / "containers" / "auth.json", home / ".docker" / "config.json"]
    return out


def env_var(registry: str) -> str:
    return "FLOWMESH_REGISTRY_AUTH_" + "".join(c if c.isalnum() else "_" for c in registry.upper())


def env_credentials(registry: str) -> Credentials | None:
    value = os.environ.get(env_var(registry))
    if not value or ":" not in value:
        return None
    user, _, pw = value.partition(":")
    return Credentials(user, pw)


def load_credentials(registry: str, files: list[Path] | None = None) -> Credentials | None:
    found = env_credentials(registry)
    if found is not None:
        return found
    for path in files if files is not None else auth_files():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        auths = data.get("auths") or {}
        for key in (registry, f"https://{registry}", f"http://{registry}"):
            entry = auths.get(key)
            if entry and entry.get("auth"):
                try:
                    user, _, pw = base64.b64decode(entry["auth"]).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    continue
                return Credentials(user, pw)
    return None


def write_auth_file(path: Path, registry: str, creds: Credentials) -> Path:
    """Write a podman-style auth file (mode 0600) holding one registry's credentials."""
    blob = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"auths": {registry: {"auth": blob}}}, fh)
    return path
