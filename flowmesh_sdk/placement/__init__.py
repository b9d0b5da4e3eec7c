"""Where a pool runs: its search space (:mod:`.infra`) and the bidder-ranked, catalog-priced
offers its instances are launched from (:mod:`.ranking`)."""

from .infra import InfraEntry, SearchSpace, parse_infra, providers_named
from .place import place
from .ranking import Candidate, Decision, Placement, PriceBook, priced_offers, query_spec, rank, registry_locality

__all__ = ["Candidate", "Decision", "InfraEntry", "Placement", "PriceBook", "SearchSpace", "parse_infra", "place",
           "priced_offers", "providers_named", "query_spec", "rank", "registry_locality"]
