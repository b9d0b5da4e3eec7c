"""A pool's search space: where it may run.

Each entry is ``provider[/region[/zone]]``; any part may be ``*`` or hold ``*``/``?``
wildcards (``alibaba/*``, ``gce/us-*``, ``ec2/us-east-1/us-east-1a``).  A bare provider
means every region the provider offers.  The entries are checked for form when the
:class:`~flowmesh_sdk.specs.PoolSpec` is built, and against the installed providers and
their offers when the pool is made (an unknown provider, or an entry that matches no
offer, is a :class:`SpecError` naming the entry, ``pool.infra[i]``).

Matching is linear in the entries (issue 24, defect 14): :class:`SearchSpace` looks up the
entries whose parts are each a name or ``*`` (most of them), and tries only those with a
partial wildcard (``gce/us-*``) one by one.
"""

from __future__ import annotations

import fnmatch
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

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
        items = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        raise SpecError(field_name, f"must be a tuple of 'provider[/region[/zone]]' entries, "
                                    f"got {type(value).__name__}") from None
    return tuple(InfraEntry.parse(f"{field_name}[{i}]", item) for i, item in enumerate(items))


class SearchSpace:
    """The entries of a search space, indexed for matching offers in linear time: an entry
    whose parts are each a name or ``*`` is one of the (at most 8) keys an offer's
    provider/region/zone is looked up under; only entries with a partial wildcard are
    tried one by one.  A repeated entry is known by its first index."""

    def __init__(self, entries: Iterable[InfraEntry]) -> None:
        self.entries = tuple(entries)
        self._exact: dict[tuple[str, str, str], int] = {}
        self._wild: list[tuple[int, InfraEntry]] = []
        self._first: dict[InfraEntry, int] = {}
        for i, entry in enumerate(self.entries):
            if self._first.setdefault(entry, i) != i:
                continue
            if entry.literal:
                self._exact[(entry.provider, entry.region, entry.zone)] = i
            else:
                self._wild.append((i, entry))

    def matching(self, provider: str, region: str, zone: str | None) -> Iterator[int]:
        """The index of each (distinct) entry that an offer in ``provider/region/zone`` matches."""
        for key in itertools.product((provider, "*"), (region, "*"), ("*",) if zone is None else (zone, "*")):
            i = self._exact.get(key)
            if i is not None:
                yield i
        for i, entry in self._wild:
            if entry.matches(provider, region, zone):
                yield i

    def matches(self, provider: str, region: str, zone: str | None) -> bool:
        return next(self.matching(provider, region, zone), None) is not None

    def unmatched(self, places: Iterable[tuple[str, str, str | None]]) -> list[int]:
        """The first index of each distinct entry that no ``(provider, region, zone)`` of
        ``places`` matches, in entry order."""
        hit = {i for place in places for i in self.matching(*place)}
        return [i for i in self._first.values() if i not in hit]


def _entry_field(i: int) -> str:
    return f"pool.infra[{i}]"


def providers_named(entries: Iterable[InfraEntry], installed: Iterable[str], *,
                    field: Callable[[int], str] = _entry_field) -> list[str]:
    """The provider names the search space reaches, in entry order.  ``installed`` is every
    provider the fleet can use (entry points and the ones it holds ready-made); a wildcard
    expands over it.  An entry naming a provider that is not installed, or a wildcard
    that matches none, is a :class:`SpecError` naming the entry (``field(i)``)."""
    names: dict[str, None] = {}
    known = sorted(set(installed))
    have = set(known)
    expanded: dict[str, list[str]] = {}   # a repeated wildcard is expanded once
    for i, entry in enumerate(entries):
        if not entry.wild_provider:
            if entry.provider not in have:
                raise SpecError(field(i), f"unknown provider {entry.provider!r}; installed providers: "
                                          f"{', '.join(known) or 'none'}")
            names.setdefault(entry.provider)
            continue
        found = expanded.get(entry.provider)
        if found is None:
            found = expanded[entry.provider] = [p for p in known if entry.matches_provider(p)]
        if not found:
            raise SpecError(field(i), f"{str(entry)!r} matches no installed provider; installed: "
                                      f"{', '.join(known) or 'none'}")
        names.update(dict.fromkeys(found))
    return list(names)


__all__ = ["InfraEntry", "SearchSpace", "parse_infra", "providers_named"]
