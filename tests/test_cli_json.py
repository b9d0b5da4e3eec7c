"""``--json`` on every command that lists or reports: each document parsed and checked
against what the library says (pools and status after a real local run on podman)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk import InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.bidder import Demand, Policy
from flowmesh_sdk.bidder.scoring import score
from flowmesh_sdk.catalog import Catalog

FLOWMESH = [sys.executable, "-m", "flowmesh_sdk"]


def cli(home: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLOWMESH_HOME": str(home)}
    res = subprocess.run([*FLOWMESH, *args], capture_output=True, text=True, env=env, timeout=120)
    if ok:
        assert res.returncode == 0, res.stderr
    return res


def doc(res: subprocess.CompletedProcess[str], schema: str) -> dict:
    lines = res.stdout.splitlines()
    assert len(lines) == 1, f"stdout must hold exactly one JSON document: {res.stdout[:500]!r}"
    out = json.loads(lines[0])
    assert out["schema"] == schema
    return out


async def test_pools_status_and_gc_json_after_a_real_run(fleet, fm_home, busybox_image):
    pool = await fleet.pool(PoolSpec(name="jsonpool", instance=InstanceSpec(cpus=1, memory_gb=2),
                                     max_instances=1, sandboxes_per_instance=2, warm_per_image=0))
    spec = SandboxSpec(image=busybox_image, cpus=0.5, memory_gb=0.25)
    results = await pool.map([Task(name="ok-1", sandbox=spec, command="echo one"),
                              Task(name="ok-2", sandbox=spec, command="echo two"),
                              Task(name="bad", sandbox=spec, command="exit 3")])
    assert sorted(r.result.exit_code for r in results) == [0, 0, 3]
    await fleet.store.flush()

    pools = doc(cli(fm_home, "pools", "--json", "--explain"), "flowmesh.pools/1")
    (row,) = [p for p in pools["pools"] if p["pool"] == "jsonpool"]
    assert (row["fleet"], row["mode"], row["tasks"]) == ("test", "persistent", 3)
    assert (row["succeeded"], row["failed"]) == (2, 1)
    assert row["infra"] == ["local"] and row["drained_at"] is None
    assert isinstance(pools["decisions"], list)

    status = doc(cli(fm_home, "status", "--json", "--limit", "10"), "flowmesh.status/1")
    by_name = {t["name"]: t for t in status["tasks"]}
    assert {"ok-1", "ok-2", "bad"} <= set(by_name)
    assert by_name["bad"]["state"] == "failed" and by_name["bad"]["exit_code"] == 3
    assert by_name["ok-1"]["state"] == "succeeded" and by_name["ok-1"]["execution_s"] > 0
    live = [i for i in status["instances"] if i["pool"] == "jsonpool"]
    assert len(live) == 1 and live[0]["state"] == "ready"
    assert status["instances"][0]["id"] == fleet.store.instances(live_only=True)[0].id

    gc = doc(cli(fm_home, "gc", "--json"), "flowmesh.gc/1")
    # the fleet's owner (this process) is alive: nothing is taken, and it is a dry run
    assert gc["dry_run"] is True and gc["result"] is None
    assert live[0]["id"] not in [o["instance_id"] for o in gc["found"]["instances"]]


def test_offers_json_matches_the_bidder(tmp_path: Path) -> None:
    out = doc(cli(tmp_path, "offers", "--cpus", "4", "--memory", "8", "--preset", "cost", "--limit", "3",
                  "--json"), "flowmesh.offers/1")
    demand = Demand(cpus=4, memory_gb=8)
    want = score(Catalog.load(warn=False).rows, demand, Policy.preset("cost")).ranking(3)
    assert [o["offer"] for o in out["offers"]] == [s.row.key for s in want]
    assert out["offers"][0]["utility"] == pytest.approx(want[0].utility)
    assert out["policy"] == {"w_t": Policy.preset("cost").w_t, "w_c": Policy.preset("cost").w_c,
                             "w_l": Policy.preset("cost").w_l}
    assert out["demand"]["cpus"] == 4 and out["feasible"] >= 3


def test_cost_estimate_and_catalog_show_json(tmp_path: Path) -> None:
    est = doc(cli(tmp_path, "cost", "estimate", "--tasks", "20", "--minutes", "10", "--providers", "ec2,gce",
                  "--top", "3", "--json"), "flowmesh.cost.estimate/1")
    assert 1 <= len(est["estimates"]) <= 3
    assert {e["provider"] for e in est["estimates"]} <= {"ec2", "gce"}
    first = est["estimates"][0]
    assert first["instances"] == 20 == sum(ln["instances"] for ln in first["plan"])   # ephemeral: one each
    assert first["total_usd"] > 0 and first["phases"]["execution_s"] == pytest.approx(600)
    totals = [e["total_usd"] for e in est["estimates"]]
    assert totals == sorted(totals)

    show = doc(cli(tmp_path, "catalog", "show", "--json"), "flowmesh.catalog.show/1")
    cat = Catalog.load(warn=False)
    assert [s["provider"] for s in show["sources"]] == [s.provider for s in cat.sources]
    assert [s["rows"] for s in show["sources"]] == [s.rows for s in cat.sources]


def test_cost_simulate_json_and_bad_input(tmp_path: Path) -> None:
    sim = doc(cli(tmp_path, "cost", "simulate", "--tasks", "2,4", "--minutes", "1", "--modes",
                  "ephemeral,persistent", "--plot", "", "--json"), "flowmesh.cost.simulate/1")
    assert [(r["tasks"], r["mode"]) for r in sim["rows"]] == [(2, "ephemeral"), (2, "persistent"),
                                                             (4, "ephemeral"), (4, "persistent")]
    for r in sim["rows"]:
        assert r["result"]["succeeded"] == r["tasks"] and r["result"]["makespan_s"] >= 60
    bad = cli(tmp_path, "cost", "simulate", "--tasks", "x", "--json", ok=False)
    assert bad.returncode == 1 and bad.stdout == "" and "--tasks" in bad.stderr


def test_log_level_and_json_logs(tmp_path: Path) -> None:
    res = cli(tmp_path, "--log-level", "debug", "--log-json", "catalog", "show", "--json")
    doc(res, "flowmesh.catalog.show/1")           # logs never reach stdout
    bad = cli(tmp_path, "--log-level", "loud", "pools", ok=False)
    assert bad.returncode == 2 and "--log-level" in bad.stderr


def test_logging_configure_writes_json_lines_under_flowmesh() -> None:
    import io
    import logging

    from flowmesh_sdk.observe import logs
    buf = io.StringIO()
    logs.configure(logs.level_from(verbose=1), json_lines=True, stream=buf)
    try:
        logging.getLogger("flowmesh.remote.ssh").info("hello %s", "there", extra={"instance": "i-1"})
        logging.getLogger("flowmesh.pools").debug("not at -v")
        logging.getLogger("elsewhere").warning("not ours")
    finally:
        logs.configure(logging.WARNING)
    (line,) = buf.getvalue().splitlines()
    rec = json.loads(line)
    assert (rec["level"], rec["logger"], rec["message"], rec["instance"]) == ("info", "flowmesh.remote.ssh",
                                                                               "hello there", "i-1")


def test_every_module_logs_under_the_flowmesh_tree() -> None:
    root = Path(__file__).resolve().parents[1]
    bad = []
    for base in ("flowmesh_sdk", "providers"):
        for path in (root / base).rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "logging.getLogger(__name__)" in line:
                    bad.append(f"{path.relative_to(root)}:{n}")
    assert not bad, f"loggers outside the flowmesh tree: {bad}"


def test_catalog_refresh_json_against_the_vast_emulator(tmp_path: Path) -> None:
    from flowmesh_sdk.testing.price_apis import VastSearchEmulator, vast_offer

    offers = [vast_offer(7, "RTX 4090", 1, 24564, 0.31, 0.16, geolocation="Texas, US"),
              vast_offer(8, "H100 SXM", 1, 81559, 1.9, 1.1, geolocation="Quebec, CA")]
    env_extra = {"VAST_API_KEY": "test-vast-key", "FLOWMESH_CACHE_DIR": str(tmp_path / "cache")}
    with VastSearchEmulator(offers) as emu:
        env = {**os.environ, "FLOWMESH_HOME": str(tmp_path), **env_extra}
        res = subprocess.run([*FLOWMESH, "catalog", "refresh", "--provider", "vast", "--endpoint", emu.url, "--json"],
                             capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    out = doc(res, "flowmesh.catalog.refresh/1")["result"]
    assert (out["provider"], out["rows"], out["priced"]) == ("vast", 2, 2)
    assert out["path"] == str(tmp_path / "cache" / "catalog" / "vast.csv") and Path(out["path"]).is_file()
    assert "test-vast-key" not in res.stdout + res.stderr


@pytest.mark.parametrize("group", [(), ("catalog",), ("cost",), ("config",), ("serve",)])
def test_every_commands_summary_in_help_is_one_line_of_prose(fm_home, group):
    """In a ``--help`` list each command's summary is its docstring's first paragraph as one
    run of prose (typer's panel kept the docstring's line breaks: a ragged column)."""
    env = {**os.environ, "FLOWMESH_HOME": str(fm_home), "COLUMNS": "400", "NO_COLOR": "1"}
    out = subprocess.run([*FLOWMESH, *group, "--help"], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    panel = [line for line in out[out.index("Commands"):].splitlines() if line.startswith("│")]
    rows = [line[2:] for line in panel]       # "│ NAME  SUMMARY │"; a summary's second line would start blank
    assert rows and all(row[:1] not in ("", " ") for row in rows), rows
