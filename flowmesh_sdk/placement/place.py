"""Placing a pool: from its search space and the providers it names to the ranked,
priced offers its instances are launched from.

1. Providers that cannot serve the pool are left out, each with the reason: instances
   that are containers themselves (``nested_containers=False``) hold no auto pool's
   sandboxes, nor a persistent pool's that also spans machines (a persistent pool of
   them alone keeps warm pods: :mod:`flowmesh_sdk.pools.warm_pods`); a provider without
   spot serves no ``spot="only"`` pool.
2. Every provider left is asked for the shapes that fit (:func:`.ranking.query_spec`),
   all at once; one that refuses its credentials (``AuthError``) is left out with its
   error, as the launch path skips it, and only when every one refuses is one
   ``AuthError`` raised, naming each.  Each search-space entry must match at least one
   offer (else a :class:`SpecError` naming the entry).
3. The offers are priced from the catalog (:func:`.ranking.priced_offers`) and ranked by
   the bidder (:func:`.ranking.rank`), with the warm images' registry region as the
   locality term.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from ..bidder.gates import NoFeasibleOffer
from ..catalog.loader import Catalog
from ..errors import AuthError, SpecError
from ..provider import Provider
from ..specs import InstanceSpec, Offer, PoolMode, PoolSpec
from .infra import SearchSpace
from .ranking import Placement, PriceBook, priced_offers, query_spec, rank, registry_locality

log = logging.getLogger("flowmesh.placement")


async def place(spec: PoolSpec, providers: Mapping[str, Provider],
                catalog: Callable[[], Catalog]) -> tuple[dict[str, Provider], Placement]:
    """The providers that can serve ``spec`` and its :class:`Placement`; ``catalog`` is
    called only when some provider's offers need pricing."""
    providers = dict(providers)
    space = spec.search_space
    why_not: list[str] = []
    direct = [n for n, p in providers.items() if not p.capabilities.nested_containers]
    if spec.mode is PoolMode.AUTO or (spec.mode is PoolMode.PERSISTENT and len(direct) < len(providers)):
        for n in direct:
            why_not.append(f"{n}: its instances are containers themselves (nested_containers=False), so "
                           f"they cannot hold sandboxes of a {spec.mode.value} pool that also spans machines; "
                           "use it alone (a persistent pool of warm pods) or in an ephemeral pool")
            del providers[n]
    if spec.spot == "only":
        for n in [n for n, p in providers.items() if not p.capabilities.spot]:
            why_not.append(f"{n}: sells no spot instances, and pool.spot is 'only'")
            del providers[n]
    if not providers:
        raise SpecError("pool.infra", "no provider of the search space can serve this pool: " + "; ".join(why_not))
    qspec = query_spec(spec)
    raw = await _offers(providers, qspec, why_not)
    for i in SearchSpace(space).unmatched((o.provider, o.region, o.zone) for offers in raw.values() for o in offers):
        entry = space[i]
        if any(entry.matches_provider(n) for n in providers):   # else explained by why_not
            prov = providers.get(entry.provider)
            why = getattr(prov, "explain_misfit", None) if prov else None
            where = f" in region {entry.region!r}" if entry.region != "*" else ""
            where += f" zone {entry.zone!r}" if entry.zone != "*" else ""
            field = "pool.instance" if len(space) == 1 else f"pool.infra[{i}]"
            raise SpecError(field, f"no offer of provider {entry.provider!r}{where} fits"
                                   + (f": {why(qspec)}" if why and where == "" else "")
                                   + ("" if len(space) == 1 else f" (entry {str(entry)!r} matches nothing)"))
    need_prices = any(not p.capabilities.free for p in providers.values())
    book = PriceBook(catalog().rows if need_prices else ())
    priced, excluded = priced_offers(raw, free={n: p.capabilities.free for n, p in providers.items()},
                                     spot_capable={n: p.capabilities.spot for n, p in providers.items()},
                                     book=book, spot=spec.spot, space=space)
    resident = tuple(dict.fromkeys(e for image in spec.warm_images for e in registry_locality(image)))
    try:
        ranked = rank(priced, spec, resident=resident)
    except NoFeasibleOffer as exc:
        raise SpecError("pool.instance", f"no offer fits this pool: {exc}") from exc
    if not ranked:
        raise SpecError("pool.instance", "no priced offer in the search space "
                                         f"{', '.join(spec.infra)}: " + "; ".join(excluded[:10] + why_not))
    for line in excluded + why_not:
        log.info("pool %s: excluded %s", spec.name, line)
    return providers, Placement(ranked, excluded + why_not)


async def _offers(providers: dict[str, Provider], qspec: InstanceSpec, why_not: list[str]) -> dict[str, list[Offer]]:
    """Every provider's offers, asked all at once.  A provider that refuses its
    credentials is removed from ``providers`` with the reason in ``why_not``; when every
    one refuses, one :class:`AuthError` names each.  Any other error is raised."""
    names = list(providers)
    found = await asyncio.gather(*(providers[n].offers(qspec) for n in names), return_exceptions=True)
    refused: dict[str, AuthError] = {}
    raw: dict[str, list[Offer]] = {}
    for name, got in zip(names, found):
        if isinstance(got, AuthError):
            refused[name] = got
        elif isinstance(got, BaseException):
            raise got
        else:
            raw[name] = list(got)
    if refused and not raw:
        raise AuthError.of_each(refused)
    for name, exc in refused.items():
        why_not.append(f"{name}: its credentials were refused when asked for offers, so it is left out: {exc}")
        del providers[name]
    return raw
