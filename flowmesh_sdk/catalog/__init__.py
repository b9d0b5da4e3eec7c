"""The price catalog: instance shapes and their $/h per provider, region and market.

Each cloud provider ships a dated snapshot in its own package (its descriptor's
``snapshot``, every row with its source; the format is ``data/README.md``);
``flowmesh catalog refresh --provider P`` replaces one provider's rows with live prices
from that provider's own price API, kept in the user's cache directory.  See
``docs/cost-model.md``.
"""

from .. import backends
from .gpus import GPU_SPECS, GpuSpec, gpu_spec
from .loader import (COLUMNS, Catalog, CatalogSource, StaleCatalogWarning, cache_dir, max_age_days, parse_csv,
                     read_csv, write_csv)
from .profiles import Bucket, ProviderProfile, profile
from .records import MARKETS, CatalogRow, canonical_provider, gpu_key, infer_arch
from .refresh import RefreshResult, price_sources, refresh


def __getattr__(name: str) -> object:
    """``PROVIDERS`` and ``PROFILES``, kept for one release: the installed descriptors
    (:func:`flowmesh_sdk.backends.catalog_providers`, each descriptor's ``profile``)."""
    if name == "PROVIDERS":
        return backends.catalog_providers()
    if name == "PROFILES":
        return {n: d.profile for n, d in backends.descriptors().items() if d.profile is not None}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Bucket", "COLUMNS", "Catalog", "CatalogRow", "CatalogSource", "GPU_SPECS", "GpuSpec", "MARKETS",
           "ProviderProfile", "RefreshResult", "StaleCatalogWarning", "cache_dir",
           "canonical_provider", "gpu_key", "gpu_spec", "infer_arch", "max_age_days", "parse_csv",
           "price_sources", "profile", "read_csv", "refresh", "write_csv"]
