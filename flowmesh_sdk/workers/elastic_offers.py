"""What an elastic role may rent: its arguments checked, and the providers' offers priced
(:func:`~flowmesh_sdk.placement.ranking.priced_offers`) and ranked by the bidder's U for
one worker of a GPU demand carrying the :class:`~flowmesh_sdk.bidder.ModelSpec`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence

from ..bidder.demand import Demand, ModelSpec
from ..errors import SpecError
from ..placement.infra import InfraEntry
from ..placement.ranking import Candidate, PriceBook, priced_offers, rank_demand
from ..provider import Provider
from ..specs import InstanceSpec, Policy
from .elastic_records import ScalingPolicy, ServeCommand

log = logging.getLogger("flowmesh.workers.elastic")

_SPOT = {"on-demand": "never", "spot": "only", "any": "prefer"}
ANYWHERE = (InfraEntry("*"),)


def check_role(providers: Provider | Mapping[str, Provider], spec: InstanceSpec, model: ModelSpec,
               engine: ServeCommand) -> dict[str, Provider]:
    """The role's providers by name; a :class:`SpecError` naming the bad argument."""
    provs: dict[str, Provider] = ({providers.name: providers} if isinstance(providers, Provider)
                                  else dict(providers))
    if not provs or not all(isinstance(p, Provider) for p in provs.values()):
        raise SpecError("elastic.providers", "must be a Provider or a non-empty mapping of name -> Provider")
    if not isinstance(spec, InstanceSpec) or spec.gpus < 1:
        raise SpecError("elastic.spec", f"must be an InstanceSpec with gpus >= 1, got {spec!r}")
    if not any(p.capabilities.gpus for p in provs.values()):
        raise SpecError("elastic.providers", "no provider declares GPUs (Capabilities.gpus)")
    if not isinstance(model, ModelSpec):
        raise SpecError("elastic.model", f"must be a ModelSpec, got {type(model).__name__}")
    if not isinstance(engine, ServeCommand):
        raise SpecError("elastic.engine", f"must be a ServeCommand, got {type(engine).__name__}")
    return provs


async def rank_for_role(providers: Mapping[str, Provider], spec: InstanceSpec, model: ModelSpec,
                        scaling: ScalingPolicy, weights: Policy, *, resident: Sequence[str], book: PriceBook,
                        held: Collection[str], role: str) -> list[Candidate]:
    """Every provider's offers, priced and ranked by U for one worker (best first), the
    offer ids in ``held`` left out; :class:`NoFeasibleOffer` names the gates when none fits."""
    names = list(providers)
    found = await asyncio.gather(*(providers[n].offers(spec) for n in names))
    priced, excluded = priced_offers(
        dict(zip(names, found)), free={n: p.capabilities.free for n, p in providers.items()},
        spot_capable={n: p.capabilities.spot for n, p in providers.items()}, book=book,
        spot=_SPOT[scaling.market], space=ANYWHERE)
    for line in excluded:
        log.info("elastic %s: excluded %s", role, line)
    priced = [o for o in priced if o.offer_id is None or o.offer_id not in held]
    demand = Demand(count=1, cpus=spec.cpus, memory_gb=spec.memory_gb, gpus=spec.gpus, gpu_name=spec.gpu_name,
                    model=model, arch=spec.arch, market=scaling.market, resident=tuple(resident),
                    max_per_instance=1, gpu_hosts=True)
    return rank_demand(priced, demand, weights)
