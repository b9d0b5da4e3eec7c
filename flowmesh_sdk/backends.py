"""The installed providers: every :class:`~flowmesh_sdk.descriptor.ProviderDescriptor`
registered under the entry-point group ``flowmesh_sdk.providers``.

A provider package is installed when its distribution declares, in ``pyproject.toml``::

    [project.entry-points."flowmesh_sdk.providers"]
    mycloud = "mycloud_flowmesh.descriptor:DESCRIPTOR"

and that is all the core needs: the catalog prices it from its snapshot, the bidder ranks
it with its profile, pools launch into it, ``flowmesh gc`` sweeps it.  Reading the
descriptors imports each provider's descriptor module only (which imports
:mod:`flowmesh_sdk.descriptor`), never its client library.  They are read once per process;
:func:`reload` reads them again (a test that installs a provider at run time).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from importlib import metadata
from types import MappingProxyType

from .descriptor import ProviderDescriptor, Setting
from .errors import SpecError

GROUP = "flowmesh_sdk.providers"
log = logging.getLogger("flowmesh.backends")


@functools.cache
def _registry() -> tuple[Mapping[str, ProviderDescriptor], Mapping[str, str], Mapping[str, str]]:
    """(descriptors by name, canonical name by alias, why each broken entry point failed)."""
    found: dict[str, ProviderDescriptor] = {}
    broken: dict[str, str] = {}
    for ep in metadata.entry_points(group=GROUP):
        try:
            d = ep.load()
        except Exception as exc:  # noqa: BLE001 - a broken plugin is reported, not fatal to the others
            broken[ep.name] = f"entry point {ep.value!r} cannot be loaded: {type(exc).__name__}: {exc}"
            log.warning("provider %s: %s", ep.name, broken[ep.name])
            continue
        if not isinstance(d, ProviderDescriptor):
            broken[ep.name] = f"entry point {ep.value!r} is not a ProviderDescriptor (got {type(d).__name__})"
        elif d.name != ep.name:
            broken[ep.name] = f"entry point {ep.name!r} names the descriptor of {d.name!r}"
        elif ep.name in found and found[ep.name] != d:
            broken[ep.name] = "registered twice, by two distributions"
        else:
            found[ep.name] = d
    aliases: dict[str, str] = {}
    for d in found.values():
        for a in d.aliases:
            if a in found or aliases.get(a, d.name) != d.name:
                raise SpecError(f"provider descriptor {d.name!r}.aliases",
                                f"{a!r} is already the name or an alias of {aliases.get(a, a)!r}")
            aliases[a] = d.name
    ordered = {name: found[name] for name in sorted(found)}
    return MappingProxyType(ordered), MappingProxyType(aliases), MappingProxyType(broken)


def reload() -> None:
    """Read the installed descriptors again on next use."""
    _registry.cache_clear()
    metadata_networks.cache_clear()


def descriptors() -> Mapping[str, ProviderDescriptor]:
    """Every installed provider's descriptor, by name (sorted)."""
    return _registry()[0]


def canonical(name: str) -> str:
    """``name`` as the SDK spells it: lowercase, an alias resolved (``aws`` -> ``ec2``)."""
    key = (name or "").strip().lower()
    return _registry()[1].get(key, key)


def find(name: str) -> ProviderDescriptor | None:
    return descriptors().get(canonical(name))


def descriptor(name: str, field_name: str = "pool.provider") -> ProviderDescriptor:
    """The descriptor of provider ``name`` (or an alias); SpecError naming ``field_name``
    and the installed providers if there is none."""
    found, _, broken = _registry()
    key = canonical(name)
    if key in found:
        return found[key]
    if key in broken:
        raise SpecError(field_name, f"provider {name!r} is installed but broken: {broken[key]}")
    known = ", ".join(found) or "none (is flowmesh-sdk installed with `pip install -e .`?)"
    raise SpecError(field_name, f"unknown provider {name!r}; installed providers: {known}")


def catalog_providers() -> tuple[str, ...]:
    """The providers the price catalog covers: those that ship a snapshot."""
    return tuple(n for n, d in descriptors().items() if d.snapshot is not None)


def provider_settings() -> tuple[Setting, ...]:
    return tuple(s for d in descriptors().values() for s in d.settings)


@functools.cache
def metadata_networks() -> tuple[str, ...]:
    """Every installed cloud's instance-metadata addresses (blocked in every sandbox);
    computed once (every instance's runtime config asks), again after :func:`reload`."""
    seen: dict[str, None] = {}
    for d in descriptors().values():
        seen.update(dict.fromkeys(d.metadata_networks))
    return tuple(seen)


__all__ = ["GROUP", "canonical", "catalog_providers", "descriptor", "descriptors", "find", "metadata_networks",
           "provider_settings", "reload"]
