"""Reading and writing price catalogs: the dated snapshot shipped with the package, and
the refreshed catalogs kept in the user's cache directory.

File format: CSV with the header of the shared price data (``data/README.md``)::

    provider,region,zone,instance_type,vcpus,memory_gib,gpu_name,gpu_count,gpu_memory_gib,
    price_hour_usd,spot_price_hour_usd,source,snapshot_date

plus three optional columns written by the live refresh: ``arch``, ``reliability`` and
``available``.  A blank price means "no price known" (the row is kept; the bidder
excludes it and says so).  A row whose GPU count is 0 but names a GPU (GCE's ``g4``
fractional-GPU sizes) is kept as a CPU shape: a fraction of a GPU is not a GPU a
worker can be given.

A file that cannot be read raises :class:`~flowmesh_sdk.errors.SpecError` whose field is
``<file>:<line>`` (and the column), so the bad line is found at once.

Where the catalog comes from, per provider: the refreshed file in
:func:`cache_dir` when there is one and it is at least as new as the shipped snapshot,
else the shipped snapshot.  A catalog older than ``max_age_days`` (default 30,
``FLOWMESH_CATALOG_MAX_AGE_DAYS``) or undated is *stale*: :meth:`Catalog.stale` lists
it and loading warns (:class:`StaleCatalogWarning`), because prices move.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from .. import backends, settings
from ..errors import SpecError
from .records import CatalogRow, as_date, canonical_provider, infer_arch

COLUMNS = ("provider", "region", "zone", "instance_type", "vcpus", "memory_gib", "gpu_name", "gpu_count",
           "gpu_memory_gib", "price_hour_usd", "spot_price_hour_usd", "source", "snapshot_date")
OPTIONAL_COLUMNS = ("arch", "reliability", "available")
DEFAULT_MAX_AGE_DAYS = 30.0


class StaleCatalogWarning(UserWarning):
    """A catalog is older than the staleness threshold, or undated."""


def cache_dir() -> Path:
    """Where refreshed catalogs live: ``catalog/`` under the ``cache_dir`` setting
    (``$FLOWMESH_CACHE_DIR``, the config file, else ``$XDG_CACHE_HOME/flowmesh``, else
    ``~/.cache/flowmesh``)."""
    return Path(settings.value("cache_dir")).expanduser() / "catalog"


def max_age_days() -> float:
    """The ``catalog.max_age_days`` setting (``$FLOWMESH_CATALOG_MAX_AGE_DAYS``, the config file)."""
    found = settings.resolve("catalog.max_age_days")
    if found.source == "default":
        return DEFAULT_MAX_AGE_DAYS
    if found.value <= 0:
        raise SpecError("catalog.max_age_days", f"{found.source}: must be > 0, got {found.value!r}")
    return float(found.value)


def _num(text: str, where: str, column: str) -> float | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise SpecError(f"{where} ({column})", f"must be a number, got {text!r}") from None


def _int(text: str, where: str, column: str) -> int | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{where} ({column})", f"must be an integer, got {text!r}") from None


def _present(name: str, value: float | None) -> float:
    """A required number: an empty cell is refused as the row would refuse it."""
    if value is None:
        raise SpecError(name, f"must be a number > 0, got {value!r}")
    return value


def parse_csv(text: str, name: str) -> list[CatalogRow]:
    """Rows of one catalog file; ``name`` is how errors name the file."""
    reader = csv.DictReader(io.StringIO(text))
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise SpecError(f"{name}:1", f"header lacks column(s) {', '.join(missing)}; "
                                     f"expected {','.join(COLUMNS)}")
    rows: list[CatalogRow] = []
    for rec in reader:
        where = f"{name}:{reader.line_num}"
        if None in rec or any(v is None for v in rec.values()):
            raise SpecError(where, f"has {len([v for v in rec.values() if v is not None])} fields; "
                                   f"the header has {len(header)}")
        rec = {k.strip(): (v or "").strip() for k, v in rec.items()}
        if not any(rec.values()):
            continue
        provider = canonical_provider(rec["provider"])
        cpus = _num(rec["vcpus"], where, "vcpus")
        memory = _num(rec["memory_gib"], where, "memory_gib")
        gpus = _int(rec["gpu_count"], where, "gpu_count") or 0
        gpu_name = rec["gpu_name"] or None
        if gpus == 0:
            gpu_name = None   # a fractional GPU share (GCE g4-standard-6..24) is not a GPU
        arch = rec.get("arch") or infer_arch(provider, rec["instance_type"])
        try:
            rows.append(CatalogRow(
                provider=provider, region=rec["region"], zone=rec["zone"] or None,
                instance_type=rec["instance_type"], cpus=_present("cpus", cpus),
                memory_gb=_present("memory_gb", memory), gpus=gpus, gpu_name=gpu_name,
                gpu_memory_gb=_num(rec["gpu_memory_gib"], where, "gpu_memory_gib") if gpus else None,
                on_demand_per_hour=_num(rec["price_hour_usd"], where, "price_hour_usd"),
                spot_per_hour=_num(rec["spot_price_hour_usd"], where, "spot_price_hour_usd"),
                source=rec["source"], fetched_at=rec["snapshot_date"] or None, arch=arch,
                reliability=_num(rec.get("reliability", ""), where, "reliability"),
                available=_int(rec.get("available", ""), where, "available")))
        except SpecError as exc:
            raise SpecError(f"{where} ({exc.field})", str(exc).split(": ", 1)[-1]) from exc
    return rows


def read_csv(path: str | Path) -> list[CatalogRow]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise SpecError(str(path), f"cannot be read: {exc.strerror or exc}") from exc
    return parse_csv(text, str(path))


def _fmt(value: float | int | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.10g}"
    return str(value)


def write_csv(path: str | Path, rows: Iterable[CatalogRow]) -> Path:
    """Write ``rows`` atomically (temp file + rename) with the optional columns."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS + OPTIONAL_COLUMNS)
    for r in rows:
        writer.writerow([r.provider, r.region, r.zone or "", r.instance_type, _fmt(r.cpus), _fmt(r.memory_gb),
                         r.gpu_name or "", r.gpus, _fmt(r.gpu_memory_gb), _fmt(r.on_demand_per_hour),
                         _fmt(r.spot_per_hour), r.source, r.fetched_at or "", r.arch, _fmt(r.reliability),
                         _fmt(r.available)])
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(buf.getvalue())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def shipped_resource(provider: str) -> tuple[str, str]:
    """(package, file) of ``provider``'s shipped snapshot, from its descriptor."""
    d = backends.descriptor(provider, "providers")
    if d.snapshot is None:
        raise SpecError("providers", f"provider {d.name!r} ships no price catalog; the catalog covers "
                                     f"{', '.join(backends.catalog_providers())}")
    package, _, name = d.snapshot.partition(":")
    return package, name


def shipped_text(provider: str) -> str:
    """The shipped snapshot of ``provider`` (package data of its provider package)."""
    package, name = shipped_resource(provider)
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class CatalogSource:
    """Where one provider's rows came from and how old they are."""

    provider: str
    origin: str                  # "shipped" or "cache"
    path: str                    # file path or package resource name
    rows: int
    priced: int                  # rows with at least one price
    fetched_at: str | None       # the newest fetched_at among the rows
    age_days: float | None       # None: undated
    stale: bool


def _newest(rows: Sequence[CatalogRow]) -> str | None:
    dates = [r.fetched_at for r in rows if r.fetched_at]
    return max(dates) if dates else None


class Catalog:
    """All rows of all providers, with where each provider's rows came from."""

    def __init__(self, rows: Iterable[CatalogRow], sources: Sequence[CatalogSource] = ()) -> None:
        self.rows: tuple[CatalogRow, ...] = tuple(rows)
        self.sources: tuple[CatalogSource, ...] = tuple(sources)

    @classmethod
    def load(cls, providers: Sequence[str] | None = None, *, cache: str | Path | None = None,
             use_cache: bool = True, today: dt.date | None = None,
             max_age: float | None = None, warn: bool = True) -> Catalog:
        """The catalog of ``providers`` (default: every provider that ships a snapshot),
        newest source per provider."""
        covered = backends.catalog_providers()
        names = [canonical_provider(p) for p in (providers or covered)]
        unknown = [p for p in names if p not in covered]
        if unknown:
            raise SpecError("providers", f"unknown provider(s) {', '.join(unknown)}; "
                                         f"the catalog covers {', '.join(covered)}")
        today = today or dt.date.today()
        limit = max_age if max_age is not None else max_age_days()
        folder = Path(cache) if cache is not None else cache_dir()
        rows: list[CatalogRow] = []
        sources: list[CatalogSource] = []
        for name in names:
            package, file = shipped_resource(name)
            resource = f"{package.replace('.', '/')}/{file}"
            shipped = parse_csv(shipped_text(name), resource)
            chosen, origin, where = shipped, "shipped", resource
            cached_path = folder / f"{name}.csv"
            if use_cache and cached_path.is_file():
                cached = read_csv(cached_path)
                if (_newest(cached) or "") >= (_newest(shipped) or ""):
                    chosen, origin, where = cached, "cache", str(cached_path)
            newest = _newest(chosen)
            newest_day = as_date(newest)
            age = None if newest_day is None else (today - newest_day).days
            stale = age is None or age > limit
            sources.append(CatalogSource(provider=name, origin=origin, path=where, rows=len(chosen),
                                         priced=sum(1 for r in chosen if r.on_demand_per_hour is not None
                                                    or r.spot_per_hour is not None),
                                         fetched_at=newest, age_days=None if age is None else float(age),
                                         stale=stale))
            rows.extend(chosen)
        catalog = cls(rows, sources)
        if warn:
            for s in catalog.stale():
                msg = (f"the {s.provider} price catalog is undated ({s.origin}: {s.path}); refresh it with "
                       f"`flowmesh catalog refresh --provider {s.provider}`" if s.age_days is None else
                       f"the {s.provider} price catalog is {s.age_days:.0f} days old (fetched {s.fetched_at}, "
                       f"threshold {limit:g} days); refresh it with "
                       f"`flowmesh catalog refresh --provider {s.provider}`")
                warnings.warn(msg, StaleCatalogWarning, stacklevel=2)
        return catalog

    def stale(self) -> list[CatalogSource]:
        return [s for s in self.sources if s.stale]

    def providers(self) -> list[str]:
        return sorted({r.provider for r in self.rows})

    def filter(self, *, providers: Sequence[str] = (), regions: Sequence[str] = ()) -> Catalog:
        want_p = {canonical_provider(p) for p in providers}
        want_r = set(regions)
        return Catalog([r for r in self.rows if (not want_p or r.provider in want_p)
                        and (not want_r or r.region in want_r)], self.sources)

    def with_prices(self, overrides: Mapping[str, float], market: str = "on-demand") -> Catalog:
        """A copy where every row of an instance type in ``overrides`` has that $/h for
        ``market`` (``--price TYPE=USD``); the row's source says it was overridden."""
        if not overrides:
            return self
        known = {r.instance_type for r in self.rows}
        missing = sorted(t for t in overrides if t not in known)
        if missing:
            raise SpecError("price", f"no catalog row has instance type(s) {', '.join(missing)}")
        def priced(r: CatalogRow) -> CatalogRow:
            price = float(overrides[r.instance_type])
            source = f"--price override ({r.source})" if r.source else "--price override"
            if market == "on-demand":
                return replace(r, on_demand_per_hour=price, source=source)
            return replace(r, spot_per_hour=price, source=source)

        rows = [priced(r) if r.instance_type in overrides else r for r in self.rows]
        return Catalog(rows, self.sources)

    def __len__(self) -> int:
        return len(self.rows)


__all__ = ["COLUMNS", "Catalog", "CatalogSource", "DEFAULT_MAX_AGE_DAYS", "OPTIONAL_COLUMNS",
           "StaleCatalogWarning", "cache_dir", "max_age_days", "parse_csv", "read_csv",
           "shipped_resource", "shipped_text",
           "write_csv"]
