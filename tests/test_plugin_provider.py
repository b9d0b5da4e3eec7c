"""A provider is one folder: ``acme`` (tests/plugins/flowmesh_acme), a package no file of
the SDK names, registered only through its entry point, is priced from its own snapshot,
ranked by the bidder, launched into by a pool that runs a real task on it, reconciled,
listed by ``flowmesh offers`` and ``flowmesh cost estimate``, configured through
``flowmesh config show`` and swept by ``flowmesh gc`` (the conformance suite runs it too:
tests/providers/test_conformance.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task, backends
from flowmesh_sdk.catalog import Catalog, infer_arch
from flowmesh_sdk.control.events import Event
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.placement.ranking import registry_locality
from flowmesh_sdk.provider import TAG_FLEET, provider_class

from _plugins import installed

HERE = Path(__file__).resolve().parent


@pytest.fixture
def acme():
    assert "acme" not in backends.descriptors()      # nothing of the SDK's registers it
    with installed():
        yield backends.descriptor("acme")
    assert "acme" not in backends.descriptors()


def _cli(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "FLOWMESH_HOME": str(home), "COLUMNS": "200", **env})


def test_the_core_reads_all_it_knows_of_acme_from_its_descriptor(acme):
    assert backends.canonical("AcmeCloud") == "acme" and provider_class("acmecloud").__name__ == "AcmeProvider"
    cat = Catalog.load(["acme"], warn=False)
    (source,) = cat.sources
    assert (source.origin, source.path, source.rows, source.priced) == ("shipped", "flowmesh_acme/catalog.csv", 4, 4)
    prices = {r.instance_type: r.on_demand_per_hour for r in cat.rows}
    assert prices == {"acme.small": 0.05, "acme.large": 0.2, "acme.xlarge": 0.4, "acme.arm.large": 0.15}
    assert infer_arch("acme", "acme.arm.large") == "arm64" and infer_arch("acme", "acme.large") == "x86_64"
    assert registry_locality("registry.acme-1.acme.test/team/env:1") == ("acme/acme-1",)
    assert "acme" in backends.catalog_providers()
    from flowmesh_sdk.remote.runtime import RuntimeConfig
    assert "192.0.2.254/32" in RuntimeConfig().metadata_networks   # its metadata address is blocked
    from flowmesh_sdk.catalog import profile
    assert profile("acme").billing_min_s == 300.0 and profile("acme").buckets[0].capacity == 20


def test_a_broken_descriptor_is_refused_naming_the_field() -> None:
    from flowmesh_sdk.descriptor import ProviderDescriptor
    with pytest.raises(SpecError, match=r"descriptor 'Acme'.name"):
        ProviderDescriptor(name="Acme", provider="x:Y")
    with pytest.raises(SpecError, match=r"provider.*module:attribute"):
        ProviderDescriptor(name="acme", provider="flowmesh_acme.provider.AcmeProvider")
    with pytest.raises(SpecError, match=r"settings.*under providers.acme"):
        from flowmesh_sdk.descriptor import Setting
        ProviderDescriptor(name="acme", provider="x:Y", settings=(Setting("providers.ec2.x", ()),))


async def test_a_pool_on_acme_ranks_its_shapes_launches_runs_and_reconciles(acme, fm_home, busybox_image):
    # a 16-cpu acme machine carved from this host (accounting only), so every shape fits
    acme_provider = provider_class("acme")(cpus=16, memory_gb=64, state_dir=fm_home / "acme")
    fleet = Fleet("acme-test", home=fm_home, providers={"acme": acme_provider})
    try:
        decided: list[Event] = []
        fleet.bus.on(decided.append, EventKind.LAUNCH_DECIDED)
        pool = await fleet.pool(PoolSpec(name="a", infra=("acme",), instance=InstanceSpec(cpus=2, memory_gb=4),
                                         max_instances=1, policy="cost"))
        res = await pool.run_task(Task(name="t", sandbox=SandboxSpec(image=busybox_image, cpus=1, memory_gb=0.5),
                                       command="echo on acme"))
        assert res.error is None and res.result.stdout.strip() == "on acme"
        d = json.loads(decided[0].detail)                 # ranked by the bidder, priced from its snapshot
        assert d["winner"]["offer"].startswith("acme/acme-1/acme.small") and d["winner"]["price_per_hour"] == 0.05
        assert d["runner_up"]["offer"].startswith("acme/acme-1/acme.large")
        (iid,) = pool.instances
        assert iid.startswith("acme-")
        spent = fleet.spend().spent
        assert spent == pytest.approx(0.05 * 300 / 3600, rel=0.05)   # its price for its 300 s billing minimum
        # deleted behind the pool's back: the reconciler sees it gone
        await fleet.provider("acme").terminate([iid])
        report = await fleet.reconcile_pools()
        assert report["a"].gone == (iid,)
        await pool.drain()
    finally:
        await fleet.close(timeout_s=30)


def test_offers_cost_estimate_and_config_list_acme(acme, tmp_path):
    offers = _cli("offers", "--provider", "acme", "--cpus", "2", "--memory", "4", "--json", home=tmp_path)
    assert offers.returncode == 0, offers.stderr
    ranked = json.loads(offers.stdout)
    text = json.dumps(ranked)
    assert "acme.small" in text and "acme-1" in text
    est = _cli("cost", "estimate", "--tasks", "20", "--minutes", "10", "--cpus", "2", "--memory", "4",
               "--providers", "acme", home=tmp_path)
    assert est.returncode == 0, est.stderr
    assert "acme" in est.stdout and "acme.small" in est.stdout
    shown = _cli("config", "show", home=tmp_path, FLOWMESH_ACME_STATE=str(tmp_path / "state"))
    assert shown.returncode == 0, shown.stderr
    assert "providers.acme.state_dir" in shown.stdout and "FLOWMESH_ACME_STATE" in shown.stdout


async def test_gc_sweeps_what_a_crashed_coordinator_left_on_acme(acme, tmp_path):
    state = str(tmp_path / "acme-state")
    rebuild = json.dumps(["flowmesh_acme.conformance:rebuild", {"state_dir": state}])
    proc = subprocess.Popen([sys.executable, str(HERE / "providers" / "_coordinator.py"), rebuild, "crashed"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ids = set(proc.stdout.readline().split())                # type: ignore[union-attr]
        assert ids, proc.stderr.read() if proc.poll() is not None else "no output"   # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    gc = _cli("gc", "--provider", "acme", "--yes", home=tmp_path, FLOWMESH_ACME_STATE=state)
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert all(i in gc.stdout for i in ids)
    from flowmesh_acme.conformance import rebuild as make
    assert await make(state).list_tagged({TAG_FLEET: "crashed"}) == []
