"""A pool's search space, entry by entry: where it may run.

Each entry is ``provider[/region[/zone]]``; any part may be ``*`` or hold ``*``/``?``
wildcards (``alibaba/*``, ``gce/us-*``, ``ec2/us-east-1/us-east-1a``).  A bare provider
means every region the provider offers.  The entries are checked for form when the
:class:`~flowmesh_sdk.specs.PoolSpec` is built (here); against the installed providers and
their offers when the pool is made (:mod:`flowmesh_sdk.placement.infra`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from .. import backends
from ..errors import SpecError

_PART = re.compile(r"[A-Za-z0-9*?][A-Za-z0-9_.*?-]{0,62}", re.ASCII)
_PROVIDER = re.compile(r"[a-z*?][a-z0-9_*?-]{0,31}", re.ASCII)


@dataclass(frozen=True, slots=True)
class InfraEntry:
    provider: str
    region: str = "*"
    zone: str = "*"

    @classmethod
    def parse(cls, field_name: str, text: object) -> InfraEntry:
        if not isinstance(text, str) or not text.strip():
            raise SpecError(field_name, "must be 'provider', 'provider/region' or 'provider/region/zone' "
                                        f"(wildcards '*' allowed), got {text!r}")
        parts = text.strip().split("/")
        if len(parts) > 3 or not all(parts):
            raise SpecError(field_name, "must be 'provider', 'provider/region' or 'provider/region/zone'; "
                                        f"got {text!r}")
        if not _PROVIDER.fullmatch(parts[0]):
            raise SpecError(field_name, "the provider part must be a provider name in lowercase (one of "
                                        f"{', '.join(backends.descriptors())}) or a wildcard; got {parts[0]!r}")
        for part in parts[1:]:
            if not _PART.fullmatch(part):
                raise SpecError(field_name, f"region and zone must be letters, digits, '-', '_', '.' or "
                                            f"wildcards; got {part!r}")
        return cls(*parts)

    @property
    def wild_provider(self) -> bool:
        return _wild(self.provider)

    @property
    def literal(self) -> bool:
        """Each part is a name or exactly ``*``: the entry is found by lookup, not matched."""
        return all(part == "*" or not _wild(part) for part in (self.provider, self.region, self.zone))

    def matches_provider(self, provider: str) -> bool:
        return fnmatch.fnmatchcase(provider, self.provider)

    def matches(self, provider: str, region: str, zone: str | None) -> bool:
        if not fnmatch.fnmatchcase(provider, self.provider) or not fnmatch.fnmatchcase(region, self.region):
            return False
        return self.zone == "*" or (zone is not None and fnmatch.fnmatchcase(zone, self.zone))

    def __str__(self) -> str:
        parts = [self.provider, self.region, self.zone]
        while len(parts) > 1 and parts[-1] == "*":
            parts.pop()
        return "/".join(parts)


def _wild(part: str) -> bool:
    return "*" in part or "?" in part


def parse_infra(field_name: str, value: object) -> tuple[InfraEntry, ...]:
    """The entries of a search space, in the order given (so that ``pool.infra[i]`` names
    the same entry at construction and when the pool is made); a bare string is refused
    (it is one entry: write a tuple)."""
    if isinstance(value, (str, bytes)):
        raise SpecError(field_name, f"must be a tuple of entries, got the string {value!r}; write ({value!r},)")
    try:
        items = tuple(cast("Iterable[object]", value))   # any iterable: what is not one is refused below
    except TypeError:
        raise SpecError(field_name, f"must be a tuple of 'provider[/region[/zone]]' entries, "
                                    f"got {type(value).__name__}") from None
    return tuple(InfraEntry.parse(f"{field_name}[{i}]", item) for i, item in enumerate(items))


__all__ = ["InfraEntry", "parse_infra"]
