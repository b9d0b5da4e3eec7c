"""EC2 prices from the dated snapshot shipped with the package (``prices_aws.csv``).

The snapshot is a copy of ``data/prices/aws.csv``: on-demand Linux list prices per
instance-hour, USD, region level (no zones), with a ``source`` column naming where each
row came from (``aws/karpenter-provider-aws`` generated price table, snapshot
2026-07-20, us-east-1 only; no spot prices).  An instance type with no row for a region
has no price there and is not offered; a row without a spot price gets no spot offer
(no estimate is made).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SNAPSHOT = "prices_aws.csv"


@dataclass(frozen=True, slots=True)
class PriceRow:
    region: str
    instance_type: str
    on_demand: float
    spot: float | None
    gpu_name: str | None
    source: str
    snapshot_date: str


def _float(text: str) -> float | None:
    text = (text or "").strip()
    if not text:
        return None
    value = float(text)
    return value if value > 0 else None


class PriceTable:
    """(region, instance type) -> :class:`PriceRow`."""

    def __init__(self, rows: list[PriceRow]) -> None:
        self._rows = {(r.region, r.instance_type): r for r in rows}

    @classmethod
    def parse(cls, text: str) -> PriceTable:
        rows = []
        for rec in csv.DictReader(io.StringIO(text)):
            if (rec.get("provider") or "aws") != "aws":
                continue
            on_demand = _float(rec.get("price_hour_usd", ""))
            if on_demand is None:
                continue  # no price, no offer
            rows.append(PriceRow(region=rec["region"].strip(), instance_type=rec["instance_type"].strip(),
                                 on_demand=on_demand, spot=_float(rec.get("spot_price_hour_usd", "")),
                                 gpu_name=(rec.get("gpu_name") or "").strip() or None,
                                 source=(rec.get("source") or "").strip(),
                                 snapshot_date=(rec.get("snapshot_date") or "").strip()))
        return cls(rows)

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The snapshot shipped with the package, or a CSV of the same header at ``path``."""
        if path is not None:
            return cls.parse(Path(path).read_text(encoding="utf-8"))
        return cls.parse(resources.files(__package__).joinpath(SNAPSHOT).read_text(encoding="utf-8"))

    def get(self, region: str, instance_type: str) -> PriceRow | None:
        return self._rows.get((region, instance_type))

    def instance_types(self, region: str) -> list[str]:
        return sorted(t for (r, t) in self._rows if r == region)

    def regions(self) -> list[str]:
        return sorted({r for (r, _) in self._rows})

    def __len__(self) -> int:
        return len(self._rows)


__all__ = ["PriceRow", "PriceTable", "SNAPSHOT"]
