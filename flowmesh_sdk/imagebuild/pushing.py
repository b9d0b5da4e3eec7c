"""Pushing a built image to a registry as ``REGISTRY/flowmesh/NAME:TAG``, and the checks on
the registry name (``HOST[:PORT]``) and on ``--tls-verify`` (false only for loopback)."""

from __future__ import annotations

import ipaddress
import re

from .host import ImageBuildError, _log, _podman, _run


def parse_registry(registry: str) -> tuple[str, int | None]:
    """``HOST[:PORT][/PATH]`` -> (host, port); raises ImageBuildError on anything else.

    IPv6 addresses need brackets (``[::1]:5000``). A scheme (``http://``) is
    refused, because podman takes a bare registry name.
    """
    if not isinstance(registry, str) or not registry.strip():
        raise ImageBuildError("registry is empty: give it as HOST:PORT, e.g. 127.0.0.1:5000")
    reg = registry.strip()
    if "://" in reg:
        raise ImageBuildError(
            f"bad registry {registry!r}: give it as HOST:PORT without a scheme (e.g. 127.0.0.1:5000)"
        )
    hostport = reg.split("/", 1)[0]
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", hostport) or re.fullmatch(
        r"([A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::(\d+))?", hostport)
    if not m:
        raise ImageBuildError(f"bad registry {registry!r}: expected HOST:PORT, e.g. 127.0.0.1:5000")
    host, port_s = m.group(1), m.group(2)
    port = int(port_s) if port_s is not None else None
    if port is not None and not 0 < port < 65536:
        raise ImageBuildError(f"bad registry {registry!r}: port {port} is out of range")
    return host, port


def is_loopback_registry(registry: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ``[::1]`` registries."""
    host, _ = parse_registry(registry)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_tls_verify(registry: str, tls_verify: bool | None = None) -> bool:
    """The ``--tls-verify`` value that a push to ``registry`` uses.

    None -> False for loopback registries and True otherwise. An explicit False
    for a non-loopback host raises ImageBuildError.
    """
    host, _ = parse_registry(registry)
    loopback = is_loopback_registry(registry)
    if tls_verify is None:
        return not loopback
    if not tls_verify and not loopback:
        raise ImageBuildError(
            f"refusing --tls-verify=false for registry {registry!r}: {host} is not a loopback "
            "address; unverified/plain-HTTP pushes are only allowed to 127.0.0.0/8, localhost "
            "or [::1]. Give that registry a TLS certificate that this host trusts."
        )
    return bool(tls_verify)


def push(ref: str, registry: str, *, tls_verify: bool | None = None) -> str:
    """Tag ``ref`` as ``REGISTRY/flowmesh/NAME:TAG`` and push it.

    ``tls_verify=None`` (the default) means ``--tls-verify=false`` for a loopback
    registry (127.0.0.0/8, localhost, [::1]), which serves plain HTTP, and
    ``--tls-verify=true`` for every other host. Asking for
    ``tls_verify=False`` with a non-loopback host raises ImageBuildError.
    """
    tls_verify = resolve_tls_verify(registry, tls_verify)
    repo_tag = ref.split("/", 1)[1] if ref.startswith("localhost/") else ref
    target = f"{registry.strip().rstrip('/')}/{repo_tag}"
    podman = _podman()
    _log(f"pushing {ref} -> {target}" + ("" if tls_verify else " (loopback: TLS not verified)"))
    _run([podman, "tag", ref, target], what=f"podman tag {target}", capture=True)
    _run([podman, "push", f"--tls-verify={'true' if tls_verify else 'false'}", "--quiet", target],
         what=f"podman push {target}", capture=True)
    return target
