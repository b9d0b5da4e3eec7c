"""The price catalog: the shipped snapshot, validation of catalog files (a corrupt file
names its file and line), staleness, the user cache, Offer conversion, GPU specs and
provider profiles."""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path

import pytest

from flowmesh_sdk.catalog import (PROVIDERS, Catalog, CatalogRow, StaleCatalogWarning, gpu_key, gpu_spec,
                                  infer_arch, parse_csv, profile, read_csv, write_csv)
from flowmesh_sdk.catalog.loader import COLUMNS, shipped_text
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.specs import Offer

ROOT = Path(__file__).resolve().parents[1]
HEADER = ",".join(COLUMNS)
TODAY = dt.date(2026, 11, 30)


def _row(**kw) -> CatalogRow:
    base = dict(provider="ec2", region="us-east-1", instance_type="c6i.2xlarge", cpus=8, memory_gb=16,
                on_demand_per_hour=0.34, spot_per_hour=0.12, source="test", fetched_at="2026-11-20")
    base.update(kw)
    return CatalogRow(**base)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- #
# the shipped snapshot
# --------------------------------------------------------------------------- #

def test_shipped_snapshot_covers_five_providers_with_sources() -> None:
    cat = Catalog.load(today=TODAY, warn=False)
    counts = {s.provider: s.rows for s in cat.sources}
    assert counts == {"ec2": 148, "gce": 316, "azure": 113, "alibaba": 3, "vast": 64}
    assert all(r.source for r in cat.rows), "every row names its source"
    assert {r.provider for r in cat.rows} == set(PROVIDERS)
    # dated where the source is dated; vast's source has no date, nor do alibaba's prices (implied by the
    # MegaFlow paper's totals and labelled so: no list price was found)
    by = {s.provider: s for s in cat.sources}
    assert by["ec2"].fetched_at == "2026-07-20" and by["gce"].fetched_at == "2026-07-30"
    assert by["azure"].fetched_at == "2026-06-18"
    assert by["vast"].fetched_at is None and by["alibaba"].priced == 3 and by["alibaba"].fetched_at is None
    assert all(r.source.startswith("IMPLIED by the MegaFlow paper's totals, NOT a list price")
               for r in cat.rows if r.provider == "alibaba")
    # a known figure survives the trip: n2-standard-8 = 8 x 0.031611 + 32 x 0.004237 (GCE list price)
    n2 = next(r for r in cat.rows if r.key == "gce/us-central1/n2-standard-8")
    assert n2.on_demand_per_hour == pytest.approx(0.388472)
    assert n2.spot_per_hour is not None and n2.spot_per_hour < n2.on_demand_per_hour


def test_ec2_snapshot_is_the_only_ec2_price_table() -> None:
    """One snapshot per provider, in its own folder (its descriptor's), not two that drift."""
    assert shipped_text("ec2").startswith("provider,region,")
    assert [p.name for p in (ROOT / "providers" / "ec2").glob("*.csv")] == ["catalog.csv"]
    assert not list((ROOT / "flowmesh_sdk" / "catalog" / "data").glob("*.csv"))
    shared = ROOT.parent / "shared" / "data" / "prices"
    if shared.is_dir():   # the project's shared price data, when this checkout has it beside
        for mine, theirs in (("ec2", "aws"), ("gce", "gcp"), ("azure", "azure"), ("vast", "vast")):
            assert shipped_text(mine) == (shared / f"{theirs}.csv").read_text(), mine


def test_aliases_arch_and_fractional_gpus_in_the_snapshot() -> None:
    cat = Catalog.load(today=TODAY, warn=False)
    assert not any(r.provider in ("aws", "gcp") for r in cat.rows)
    g5g = next(r for r in cat.rows if r.instance_type == "g5g.xlarge")
    assert g5g.arch == "arm64"                            # Graviton
    assert next(r for r in cat.rows if r.instance_type == "g5.xlarge").arch == "x86_64"
    g4 = next(r for r in cat.rows if r.instance_type == "g4-standard-6")
    assert g4.gpus == 0 and g4.gpu_name is None           # a fraction of a GPU is not a GPU


# --------------------------------------------------------------------------- #
# corrupt files: SpecError naming the file and the line
# --------------------------------------------------------------------------- #

GOOD = "ec2,us-east-1,,c6i.2xlarge,8,16,,0,,0.34,,src,2026-07-20"


@pytest.mark.parametrize("bad, line, words", [
    ("ec2,us-east-1,,c6i.large,two,4,,0,,0.085,,src,2026-07-20", 3, ["vcpus", "'two'"]),
    ("ec2,us-east-1,,c6i.large,2,4,,0,,-0.1,,src,2026-07-20", 3, ["on_demand_per_hour", ">= 0"]),
    ("ec2,us-east-1,,c6i.large,2,4,,0,,0.085,,src,20-07-2026", 3, ["fetched_at", "ISO date"]),
    ("ec2,us-east-1,,c6i.large,2,4,,0,,0.085", 3, ["fields"]),
    ("ec2,us-east-1,,,2,4,,0,,0.085,,src,2026-07-20", 3, ["instance_type"]),
    ("ec2,us-east-1,,c6i.large,2,4,,x,,0.085,,src,2026-07-20", 3, ["gpu_count"]),
])
def test_corrupt_row_names_file_and_line(tmp_path: Path, bad: str, line: int, words: list[str]) -> None:
    path = tmp_path / "prices.csv"
    path.write_text(f"{HEADER}\n{GOOD}\n{bad}\n{GOOD}\n")
    with pytest.raises(SpecError) as info:
        read_csv(path)
    msg = str(info.value)
    assert f"{path}:{line}" in msg, msg
    for w in words:
        assert w in msg, msg


def test_corrupt_header_and_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("provider,region,instance_type\nec2,us-east-1,c6i.large\n")
    with pytest.raises(SpecError, match=rf"{path}:1.*lacks column"):
        read_csv(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(SpecError, match="not UTF-8"):
        read_csv(path)
    with pytest.raises(SpecError, match="cannot be read"):
        read_csv(tmp_path / "missing.csv")


def test_corrupt_cache_file_is_reported_when_loading(tmp_path: Path) -> None:
    (tmp_path / "vast.csv").write_text(f"{HEADER}\nvast,US,,1x-H100,32,64,H100,1,80,abc,,src,2026-11-29\n")
    with pytest.raises(SpecError, match=r"vast\.csv:2 \(price_hour_usd\)"):
        Catalog.load(["vast"], cache=tmp_path, today=TODAY, warn=False)


# --------------------------------------------------------------------------- #
# staleness and the cache
# --------------------------------------------------------------------------- #

def test_stale_snapshot_warns_past_the_threshold() -> None:
    with pytest.warns(StaleCatalogWarning, match=r"ec2 price catalog is 41 days old"):
        Catalog.load(["ec2"], today=dt.date(2026, 8, 30), max_age=30, use_cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # a fresh catalog warns nothing
        cat = Catalog.load(["ec2"], today=dt.date(2026, 8, 1), max_age=30, use_cache=False)
    assert not cat.stale()
    with pytest.warns(StaleCatalogWarning, match="vast price catalog is undated"):
        Catalog.load(["vast"], today=TODAY, use_cache=False)


def test_threshold_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWMESH_CATALOG_MAX_AGE_DAYS", "365")
    assert not Catalog.load(["ec2"], today=TODAY, use_cache=False, warn=False).stale()
    monkeypatch.setenv("FLOWMESH_CATALOG_MAX_AGE_DAYS", "soon")
    with pytest.raises(SpecError, match="FLOWMESH_CATALOG_MAX_AGE_DAYS"):
        Catalog.load(["ec2"], today=TODAY, use_cache=False, warn=False)


def test_refreshed_cache_takes_precedence_when_newer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWMESH_CACHE_DIR", str(tmp_path))
    from flowmesh_sdk.catalog import cache_dir
    assert cache_dir() == tmp_path / "catalog"
    write_csv(cache_dir() / "ec2.csv", [_row(on_demand_per_hour=0.30, fetched_at="2026-11-29T10:00:00Z")])
    cat = Catalog.load(["ec2"], today=TODAY, warn=False)
    assert [s.origin for s in cat.sources] == ["cache"] and len(cat) == 1
    assert cat.rows[0].on_demand_per_hour == 0.30 and not cat.stale()
    # an older cached file loses to the newer shipped snapshot
    write_csv(cache_dir() / "ec2.csv", [_row(fetched_at="2026-01-01")])
    assert Catalog.load(["ec2"], today=TODAY, warn=False).sources[0].origin == "shipped"


def test_write_read_round_trip(tmp_path: Path) -> None:
    rows = [_row(), _row(provider="vast", region="Texas, US", zone="offer-7", instance_type="2x-RTX_4090",
                         cpus=15.5, memory_gb=62.5, gpus=2, gpu_name="RTX 4090", gpu_memory_gb=48,
                         on_demand_per_hour=0.71, spot_per_hour=0.4, reliability=0.987, available=1,
                         fetched_at="2026-11-30T04:00:00Z")]
    back = read_csv(write_csv(tmp_path / "x.csv", rows))
    assert back == rows


def test_unknown_provider_and_price_overrides() -> None:
    with pytest.raises(SpecError, match="unknown provider"):
        Catalog.load(["oracle"], warn=False)
    cat = Catalog.load(["alibaba"], today=TODAY, warn=False)
    priced = cat.with_prices({"ecs.c8a.2xlarge": 0.3015})
    row = next(r for r in priced.rows if r.instance_type == "ecs.c8a.2xlarge")
    assert row.on_demand_per_hour == 0.3015 and row.source.startswith("--price override")
    with pytest.raises(SpecError, match="no catalog row has instance type"):
        cat.with_prices({"ecs.nope.large": 1.0})


# --------------------------------------------------------------------------- #
# rows and offers
# --------------------------------------------------------------------------- #

def test_row_turns_into_one_offer_per_priced_market() -> None:
    row = _row(gpus=1, gpu_name="A10G", gpu_memory_gb=24)
    od, spot = row.offers()
    assert isinstance(od, Offer) and not od.spot and od.price_per_hour == 0.34
    assert spot.spot and spot.price_per_hour == 0.12
    assert od.gpu_memory_gb == 24 and od.source == "test" and od.fetched_at == "2026-11-20"
    assert [o.spot for o in _row(spot_per_hour=None).offers()] == [False]
    assert _row(on_demand_per_hour=None, spot_per_hour=None).offers() == []
    back = CatalogRow.from_offer(spot)
    assert back.spot_per_hour == 0.12 and back.on_demand_per_hour is None and back.gpu_name == "A10G"


def test_row_validation() -> None:
    with pytest.raises(SpecError, match="cpus"):
        _row(cpus=0)
    with pytest.raises(SpecError, match="reliability"):
        _row(reliability=1.5)
    with pytest.raises(SpecError, match="arch"):
        _row(arch="sparc")
    with pytest.raises(SpecError, match="provider"):
        _row(provider="Not A Name!")
    assert _row(provider="AWS").provider == "ec2"


def test_gpu_names_arch_rules_and_specs() -> None:
    assert gpu_key("h100-80gb") == gpu_key("H100") == gpu_key("NVIDIA H100") == "h100"
    assert gpu_key("A100 80GB") == gpu_key("a100-80gb") == "a100"
    assert gpu_key("RTX_4090") == gpu_key("RTX 4090") == "rtx4090"
    assert gpu_key("H100 NVL") == "h100nvl"
    assert infer_arch("ec2", "c7g.large") == "arm64" and infer_arch("ec2", "c7i.large") == "x86_64"
    assert infer_arch("azure", "Standard_D4ps_v5") == "arm64" and infer_arch("azure", "Standard_D4s_v5") == "x86_64"
    assert infer_arch("gce", "t2a-standard-4") == "arm64" and infer_arch("alibaba", "ecs.g8y.large") == "arm64"
    assert gpu_spec("a100", 80).bandwidth_gbs == 2039 and gpu_spec("a100", 40).bandwidth_gbs == 1555
    assert gpu_spec("H100 80GB").tflops == pytest.approx(989.5)
    assert gpu_spec("B200") is None               # not in the table: no guess


def test_each_profile_is_its_providers_own_limits() -> None:
    """One copy of each provider's API rates and launch batch: the estimate plays launches
    through the very buckets the provider's client keeps to."""
    from flowmesh_sdk import backends
    from flowmesh_sdk.provider import provider_class
    profiled = {n: d for n, d in backends.descriptors().items() if d.profile is not None}
    assert {"ec2", "gce", "azure", "alibaba", "vast"} <= set(profiled)
    for name, d in profiled.items():
        caps = provider_class(name).capabilities
        assert caps.rates == d.profile.rates and caps.max_batch == d.profile.max_batch, name
        assert profile(name) is d.profile
    from flowmesh_providers.ec2 import client
    request, per_instance = profile("ec2").buckets
    assert (request.capacity, request.refill_per_s) == client.RUN_INSTANCES_REQUEST
    assert (per_instance.capacity, per_instance.refill_per_s) == client.RUN_INSTANCES_RESOURCE
    assert client.DOC_THROTTLING.removeprefix("https://") in profile("ec2").rates_source
    assert profile("nowhere").rates_source.startswith("no profile")


def test_parse_csv_skips_blank_lines_and_keeps_unpriced_rows() -> None:
    rows = parse_csv(f"{HEADER}\n\n{GOOD}\nec2,us-east-1,,c6i.4xlarge,16,32,,0,,,,src,2026-07-20\n", "mem")
    assert len(rows) == 2 and rows[1].on_demand_per_hour is None
