"""Where a pool's next instances go: every offer of every provider in the pool's search
space, priced from the catalog, gated and ranked by the bidder's utility
U = w_t*T^ - w_c*C^ + w_l*G_loc, in the order failover walks.

Prices (one source): a provider reports shapes; the catalog prices them by
``provider/region/type`` and market.  A provider that declares ``Capabilities.free``
(this host, the user's own machines) costs 0.  A marketplace offer (``Offer.offer_id``)
without a catalog row keeps the live price its provider quoted.  Anything else without a
price is excluded, and the exclusion is said (:attr:`Placement.excluded`).

Spot: ``never`` ranks on-demand offers only; ``only`` spot offers only; ``prefer`` every
spot offer first (best U first), then the on-demand ones as the fallback.  A spot offer is
made from an on-demand shape when the provider declares spot and the catalog prices it.

Locality (G_loc = 1): offers in the provider/region of the images' registry (ECR, Artifact
Registry, Alibaba ACR hosts name their region; ``localhost/...`` images live on this
host), and provider/regions where the pool already holds instances with those images.
"""

from __future__ import annotations

import json
import math

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .. import backends
from ..bidder.demand import Demand
from ..bidder.gates import NoFeasibleOffer
from ..bidder.policy import Policy
from ..bidder.scoring import Score, score
from ..catalog.records import CatalogRow
from ..errors import SpecError
from ..specs import InstanceSpec, Offer, PoolMode, PoolSpec
from .infra import InfraEntry, SearchSpace

DEFAULT_TASK_MINUTES = 10.0   # assumed per-task duration for T_eff when the pool does not say
DEFAULT_IMAGE_GB = 2.0        # assumed image size to pull, for T_eff's pull-contention term


@dataclass(frozen=True, slots=True)
class Candidate:
    """One ranked offer: priced, with the slots an instance of it holds and its terms."""

    offer: Offer
    slots: int
    score: Score

    @property
    def terms(self) -> dict[str, float]:
        s = self.score
        return {"T": round(s.t_norm, 4), "C": round(s.c_norm, 4), "G_loc": s.g_loc, "U": round(s.utility, 4),
                "price_per_hour": self.offer.price_per_hour or 0.0, "slots": self.slots}


@dataclass(frozen=True, slots=True)
class Decision:
    """A launch decision as published: the winner, the runner-up and the policy."""

    pool: str
    count: int
    winner: Candidate
    runner_up: Candidate | None
    policy: Policy
    excluded: int = 0

    def to_json(self) -> str:
        def side(c: Candidate | None) -> dict[str, object] | None:
            return None if c is None else {"offer": c.offer.key, **c.terms}
        return json.dumps({"count": self.count, "winner": side(self.winner), "runner_up": side(self.runner_up),
                           "policy": {"w_t": self.policy.w_t, "w_c": self.policy.w_c, "w_l": self.policy.w_l},
                           "excluded": self.excluded}, sort_keys=True)

    def explain(self) -> str:
        w = self.winner
        line = (f"{self.count} x {w.offer.key} at ${w.offer.price_per_hour or 0:.4f}/h, {w.slots} slot(s): "
                f"{w.score.explain(self.policy)}")
        if self.runner_up is not None:
            r = self.runner_up
            line += (f"; runner-up {r.offer.key} at ${r.offer.price_per_hour or 0:.4f}/h, {r.slots} slot(s): "
                     f"{r.score.explain(self.policy)}")
        return line


@dataclass(slots=True)
class Placement:
    """The ranked candidates of one pool and what was left out, with the reason."""

    candidates: list[Candidate]
    excluded: list[str] = field(default_factory=list)

    def offers(self) -> list[Offer]:
        return [c.offer for c in self.candidates]

    def slots_of(self, offer: Offer) -> int:
        for c in self.candidates:
            if c.offer == offer:
                return c.slots
        raise SpecError("offer", f"{offer.key} is not one of this pool's candidates")

    def decide(self, pool: str, count: int, policy: Policy, usable: Sequence[Candidate] | None = None) -> Decision:
        cands = list(self.candidates if usable is None else usable)
        return Decision(pool=pool, count=count, winner=cands[0], runner_up=cands[1] if len(cands) > 1 else None,
                        policy=policy, excluded=len(self.excluded))


# ---- registry locality -----------------------------------------------------------------
def registry_locality(image: str) -> tuple[str, ...]:
    """The ``provider/region`` (or ``provider``) entries where an image's registry lives
    (each provider's descriptor names its registry hosts)."""
    host = image.split("/", 1)[0] if "/" in image else "docker.io"
    if host in ("localhost", "127.0.0.1") or host.startswith(("localhost:", "127.")):
        return ("local",) if host == "localhost" else ("local", "ssh")
    for name, d in backends.descriptors().items():
        region = d.registry_region(host)
        if region is not None:
            return (f"{name}/{region}",)
    return ()


# ---- pricing and ranking -----------------------------------------------------------------
class PriceBook:
    """The catalog's prices by ``provider/region/type`` (zone-specific rows win over the
    region's), for each market."""

    def __init__(self, rows: Iterable[CatalogRow]) -> None:
        self._by: dict[tuple[str, str, str, str | None], CatalogRow] = {}
        for r in rows:
            self._by[(r.provider, r.region, r.instance_type, r.zone)] = r
            self._by.setdefault((r.provider, r.region, r.instance_type, None), r)

    def row(self, offer: Offer) -> CatalogRow | None:
        return (self._by.get((offer.provider, offer.region, offer.instance_type, offer.zone))
                or self._by.get((offer.provider, offer.region, offer.instance_type, None)))

    def price(self, offer: Offer, *, spot: bool) -> tuple[float | None, str]:
        row = self.row(offer)
        if row is None:
            return None, ""
        return row.price("spot" if spot else "on-demand"), row.source


def query_spec(spec: PoolSpec) -> InstanceSpec:
    """What to ask providers for: the fixed instance, or the smallest that holds one sandbox."""
    size = spec.sandbox_size
    if size is None:
        return spec.instance
    inst = spec.instance
    return InstanceSpec(cpus=max(1, math.ceil(size.cpus - 1e-9)), memory_gb=size.memory_gb, gpus=size.gpus,
                        gpu_name=inst.gpu_name if size.gpus else None, disk_gb=inst.disk_gb, arch=inst.arch)


def priced_offers(provider_offers: Mapping[str, Sequence[Offer]], *, free: Mapping[str, bool],
                  spot_capable: Mapping[str, bool], book: PriceBook, spot: str,
                  space: Sequence[InfraEntry]) -> tuple[list[Offer], list[str]]:
    """Every offer in the search space with its price, in both markets where allowed;
    and what was left out, with why."""
    out: list[Offer] = []
    excluded: list[str] = []
    seen: set[str] = set()

    def add(o: Offer) -> None:
        if o.key not in seen:
            seen.add(o.key)
            out.append(o)

    index = SearchSpace(space)
    for name, offers in provider_offers.items():
        for o in offers:
            if not index.matches(o.provider, o.region, o.zone):
                continue
            markets = [o.spot] if free.get(name) else sorted({o.spot} | ({True} if spot_capable.get(name) else set()))
            for want_spot in markets:
                if spot == "never" and want_spot or spot == "only" and not want_spot:
                    continue
                base = replace(o, spot=want_spot)
                if free.get(name):
                    add(replace(base, price_per_hour=0.0, source=o.source or "owned machine"))
                    continue
                price, source = book.price(base, spot=want_spot)
                if price is None and o.offer_id is not None and o.spot == want_spot and o.price_per_hour is not None:
                    price, source = o.price_per_hour, o.source or "marketplace quote"
                if price is None:
                    if want_spot == o.spot or not spot_capable.get(name):
                        excluded.append(f"{base.key}: no {'spot' if want_spot else 'on-demand'} price in the "
                                        f"catalog (refresh it: flowmesh catalog refresh --provider {o.provider})")
                    continue
                add(replace(base, price_per_hour=price, source=source))
    return out, excluded


def rank_demand(offers: Sequence[Offer], demand: Demand, policy: Policy) -> list[Candidate]:
    """The bidder's ranking of priced ``offers`` for ``demand`` (best U first): each offer
    becomes a catalog row (its live price, reliability and availability kept), the gates
    and U(j,B) run on them, and every candidate keeps its offer (a Vast.ai interruptible
    one at the bid the bidder places).  :func:`rank` for a pool and the elastic GPU
    workers (:mod:`flowmesh_sdk.workers.elastic`) both rank through here.

    :class:`NoFeasibleOffer` when none passes the gates (it names each gate)."""
    if not offers:
        return []
    by_key: dict[tuple[str, str], Offer] = {}
    rows = []
    for o in offers:
        row = CatalogRow(provider=o.provider, region=o.region, instance_type=o.instance_type, cpus=o.cpus,
                         memory_gb=o.memory_gb, on_demand_per_hour=None if o.spot else o.price_per_hour,
                         spot_per_hour=o.price_per_hour if o.spot else None, gpus=o.gpus, gpu_name=o.gpu_name,
                         gpu_memory_gb=o.gpu_memory_gb, zone=o.zone, arch=o.arch, source=o.source,
                         reliability=o.reliability, available=o.available)
        by_key[(row.key, "spot" if o.spot else "on-demand")] = o
        rows.append(row)
    ranked = score(rows, demand, policy).ranking()
    return [Candidate(by_key[(s.row.key, s.market)] if s.bid_per_hour is None else
                      replace(by_key[(s.row.key, s.market)], price_per_hour=s.bid_per_hour), s.slots, s)
            for s in ranked]


def rank(offers: Sequence[Offer], spec: PoolSpec, *, resident: Sequence[str] = (),
         task_minutes: float = DEFAULT_TASK_MINUTES, image_gb: float = DEFAULT_IMAGE_GB) -> list[Candidate]:
    """The bidder's ranking of priced ``offers`` for ``spec`` (best first, failover order).

    :class:`NoFeasibleOffer` when none passes the gates (it names each gate)."""
    if not offers:
        return []
    size = spec.sandbox_size
    mode = "ephemeral" if spec.mode is PoolMode.EPHEMERAL else "persistent"
    if size is None:
        slots = 1 if spec.mode is PoolMode.EPHEMERAL else spec.sandboxes_per_instance
        inst = spec.instance
        cpus, mem, gpus, cap = inst.cpus / slots, inst.memory_gb / slots, inst.gpus, slots
    else:
        cpus, mem, gpus, cap = size.cpus, size.memory_gb, size.gpus, None
    market = {"never": "on-demand", "only": "spot", "prefer": "any"}[spec.spot]
    demand = Demand(count=spec.concurrency or 1, cpus=cpus, memory_gb=mem, gpus=gpus,
                    arch=spec.instance.arch, max_price=spec.max_price, market=market, mode=mode,
                    minutes=task_minutes, image_gb=image_gb, resident=tuple(resident), max_per_instance=cap,
                    gpu_hosts=bool(gpus))
    policy = spec.policy
    assert isinstance(policy, Policy)
    cands = rank_demand(offers, demand, policy)
    if spec.spot == "prefer":
        cands.sort(key=lambda c: not c.offer.spot)   # stable: spot first, each half by U
    return cands


__all__ = ["Candidate", "DEFAULT_IMAGE_GB", "DEFAULT_TASK_MINUTES", "Decision", "NoFeasibleOffer", "Placement",
           "PriceBook", "priced_offers", "query_spec", "rank", "rank_demand", "registry_locality"]
