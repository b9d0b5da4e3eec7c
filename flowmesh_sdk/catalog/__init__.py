"""The price catalog: instance shapes and their $/h per provider, region and market.

A dated snapshot for EC2, GCE, Azure, Alibaba ECS and Vast.ai ships with the package
(``data/``, every row with its source); ``flowmesh catalog refresh --provider P``
replaces one provider's rows with live prices from that provider's own price API,
kept in the user's cache directory.  See ``docs/cost-model.md``.
"""

from .gpus import GPU_SPECS, GpuSpec, gpu_spec
from .loader import (COLUMNS, Catalog, CatalogSource, StaleCatalogWarning, cache_dir, max_age_days, parse_csv,
                     read_csv, write_csv)
from .profiles import PROFILES, Bucket, ProviderProfile, profile
from .records import MARKETS, PROVIDERS, CatalogRow, canonical_provider, gpu_key, infer_arch
from .refresh import RefreshResult, price_sources, refresh

__all__ = ["Bucket", "COLUMNS", "Catalog", "CatalogRow", "CatalogSource", "GPU_SPECS", "GpuSpec", "MARKETS",
           "PROFILES", "PROVIDERS", "ProviderProfile", "RefreshResult", "StaleCatalogWarning", "cache_dir",
           "canonical_provider", "gpu_key", "gpu_spec", "infer_arch", "max_age_days", "parse_csv",
           "price_sources", "profile", "read_csv", "refresh", "write_csv"]
