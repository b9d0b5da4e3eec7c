"""A pool's search space: where it may run.

Each entry is ``provider[/region[/zone]]``; any part may be ``*`` or hold ``*``/``?``
wildcards (``alibaba/*``, ``gce/us-*``, ``ec2/us-east-1/us-east-1a``).  A bare provider
means every region the provider offers.  The entries are checked for form when the
:class:`~flowmesh_sdk.specs.PoolSpec` is built, and against the installed providers and
their offers when the pool is made (an unknown provider, or an entry that matches no
offer, is a :class:`SpecError` naming the entry, ``pool.infra[i]``).

Matching is linear in the entries (issue 24, defect 14): :class:`SearchSpace` looks up the
entries whose parts are each a name or ``*`` (most of them), and tries only those with a
partial wildcard (``gce/us-*``) one by one.  The entries themselves (:class:`InfraEntry`,
:func:`parse_infra`) are records of :mod:`flowmesh_sdk.specs.infra`, re-exported here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator

from ..errors import SpecError
from ..specs.infra import InfraEntry, parse_infra


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
