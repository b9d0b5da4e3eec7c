"""Instance records of host-slicing providers (``local``, ``ssh``): one JSON file per
instance under a lock.

Files are shared by every process on this host, so capacity is accounted host-wide,
and instances a crashed process left behind stay visible to ``list_tagged`` (and so to
``flowmesh gc``) until they are terminated.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from flowmesh_sdk.provider import Instance, ProviderState
from flowmesh_sdk.specs import InstanceSpec


def to_json(inst: Instance) -> str:
    s = inst.spec
    return json.dumps({
        "id": inst.id, "provider": inst.provider, "address": inst.address,
        "region": inst.region, "instance_type": inst.instance_type,
        "spec": {"cpus": s.cpus, "memory_gb": s.memory_gb, "gpus": s.gpus, "gpu_name": s.gpu_name,
                 "disk_gb": s.disk_gb, "arch": s.arch},
        "state": inst.state.value, "tags": dict(inst.tags), "launched_at": inst.launched_at,
        "price_per_hour": inst.price_per_hour, "port": inst.port, "zone": inst.zone,
    }, sort_keys=True)


def from_json(text: str) -> Instance:
    d = json.loads(text)
    return Instance(id=d["id"], provider=d.get("provider", "local"), region=d["region"],
                    instance_type=d["instance_type"], spec=InstanceSpec(**d["spec"]),
                    state=ProviderState(d["state"]), tags=d["tags"], launched_at=d["launched_at"],
                    address=d.get("address"), price_per_hour=float(d.get("price_per_hour") or 0.0),
                    port=d.get("port"), zone=d.get("zone"))


class RecordDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        with open(self.root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def all(self) -> list[Instance]:
        out = []
        for path in sorted(self.root.glob("*.json")):
            try:
                out.append(from_json(path.read_text()))
            except (OSError, ValueError, KeyError):
                continue  # a file removed or half-written by another process
        return out

    def write(self, inst: Instance) -> None:
        tmp = self.root / f".{inst.id}.tmp"
        tmp.write_text(to_json(inst))
        os.replace(tmp, self.root / f"{inst.id}.json")

    def known(self, instance_id: str) -> bool:
        """Whether a record of ``instance_id`` exists (ids are never handed out twice)."""
        return (self.root / f"{instance_id}.json").exists()

    def remove(self, instance_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.root / f"{instance_id}.json").unlink()
