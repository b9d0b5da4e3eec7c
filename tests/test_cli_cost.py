"""``flowmesh offers``, ``flowmesh catalog refresh|show`` and ``flowmesh cost estimate``,
run as a user runs them (the typer app in-process, and once the installed module in a
subprocess), on the shipped catalog and on a price-API emulator."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flowmesh_sdk.cli.main import app
from flowmesh_sdk.testing.price_apis import VastSearchEmulator, vast_offer

MEGAFLOW = ["cost", "estimate", "--tasks", "2000", "--minutes", "95", "--cpus", "8", "--memory", "16",
            "--mode", "ephemeral", "--providers", "alibaba", "--compare-centralized", "ecs.re6.52xlarge",
            "--tasks-per-instance", "50", "--price", "ecs.c8a.2xlarge=0.3015", "--price", "ecs.re6.52xlarge=20.045"]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("FLOWMESH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "250")
    return CliRunner()


def _run(cli: CliRunner, args: list[str]):  # type: ignore[no-untyped-def]
    return cli.invoke(app, args, catch_exceptions=False)


def test_offers_shows_ranked_offers_with_every_term(cli: CliRunner) -> None:
    res = _run(cli, ["offers", "--cpus", "8", "--memory", "16", "--preset", "cost", "--limit", "5"])
    assert res.exit_code == 0, res.output
    out = res.output
    for col in ("T_eff", "T^", "C^", "G_loc", "U", "slots", "$/h"):
        assert col in out
    assert "w_t=0.1 w_c=1 w_l=0.1" in out
    assert re.search(r"feasible of \d+ offers; gates removed: .*cpus -\d+", out)
    rows = [line for line in out.splitlines() if re.match(r"^\S\s+1\s", line)]
    assert rows, out                                        # row #1 is printed
    assert "stale price catalogs" in out                    # the shipped snapshot is months old: said


def test_offers_gpu_and_bad_input(cli: CliRunner) -> None:
    ok = _run(cli, ["offers", "--gpu", "H100", "--model-params", "8", "--preset", "latency", "--market", "any"])
    assert ok.exit_code == 0 and "tokens/s" in ok.output
    none = _run(cli, ["offers", "--gpu", "H100", "--model-params", "1000"])
    assert none.exit_code == 1
    assert "no feasible offer" in none.output and "vram: removed" in none.output
    neg = _run(cli, ["offers", "--weights", "-1,1,0"])
    assert neg.exit_code == 1 and "policy.w_t" in neg.output and ">= 0" in neg.output
    zero = _run(cli, ["offers", "--weights", "0,0,0"])
    assert zero.exit_code == 1 and "at least one" in zero.output


def test_cost_estimate_replays_megaflows_32_percent(cli: CliRunner) -> None:
    res = _run(cli, MEGAFLOW)
    assert res.exit_code == 0, res.output
    m = re.search(r"centralized ecs\.re6\.52xlarge x 40 \(\$([\d,.]+)\): ([\d.]+)% less", res.output)
    assert m, res.output
    assert 30.0 <= float(m.group(2)) <= 34.0              # the paper: 32 %
    assert "2000 x ecs.c8a.2xlarge" in res.output and "40 x ecs.re6.52xlarge" in res.output
    for col in ("launch (min)", "submit", "sched (min)", "env start (min)", "exec (min)"):
        assert col in res.output


def test_cost_estimate_over_the_shipped_catalog(cli: CliRunner) -> None:
    res = _run(cli, ["cost", "estimate", "--tasks", "2000", "--minutes", "60", "--cpus", "8", "--memory", "16",
                     "--mode", "ephemeral", "--providers", "ec2,gce,azure"])
    assert res.exit_code == 0, res.output
    ec2 = next(line for line in res.output.splitlines() if "ec2/us-east-1" in line)
    cells = [c.strip() for c in ec2.split("│") if c.strip()]
    # 2,000 launches on EC2: 1,000 at once, then 2 a second -> the last is accepted after 500 s
    assert cells[5] == f"{500 / 60:.1f}", cells


def test_cost_estimate_bad_input(cli: CliRunner) -> None:
    res = _run(cli, ["cost", "estimate", "--tasks", "10", "--minutes", "5", "--compare-centralized", "c5.24xlarge"])
    assert res.exit_code == 1 and "--tasks-per-instance" in res.output
    res = _run(cli, ["cost", "estimate", "--tasks", "10", "--minutes", "5", "--price", "c5.large:1"])
    assert res.exit_code == 1 and "TYPE=USD" in res.output
    res = _run(cli, ["cost", "estimate", "--tasks", "10", "--minutes", "5", "--providers", "vast"])
    assert res.exit_code == 1 and "vast (34 regions): no feasible offer -- gates removed: gpu_host -64" in res.output
    res = _run(cli, ["cost", "estimate", "--tasks", "0", "--minutes", "5"])
    assert res.exit_code == 1 and "demand.count" in res.output
    # a region no catalog row is in (it printed an empty table): named, with the regions there are
    res = _run(cli, ["cost", "estimate", "--tasks", "10", "--minutes", "5", "--providers", "ec2", "--region", "eastus"])
    assert res.exit_code == 1 and "demand.regions: 'eastus': no price catalog row of ec2" in res.output
    assert "ec2: 'us-east-1'" in res.output
    res = _run(cli, ["cost", "estimate", "--tasks", "10", "--minutes", "5", "--price", "=3"])
    assert res.exit_code == 1 and "'=3' names no instance type" in res.output
    for args in (["cost", "estimate", "--tasks", "10", "--minutes", "5", "--top", "0"], ["offers", "--limit", "0"],
                 ["status", "--limit", "0"]):
        res = _run(cli, args)
        assert res.exit_code == 2 and ">= 1" in res.output.replace("greater than or equal to", ">="), res.output


def test_catalog_refresh_then_show(cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VAST_API_KEY", "test-vast-key")
    offers = [vast_offer(7, "RTX 4090", 1, 24564, 0.31, 0.16, geolocation="Texas, US"),
              vast_offer(8, "H100 SXM", 1, 81559, 1.9, 1.1, geolocation="Quebec, CA")]
    with VastSearchEmulator(offers) as emu:
        res = _run(cli, ["catalog", "refresh", "--provider", "vast", "--endpoint", emu.url])
    assert res.exit_code == 0, res.output
    assert "vast: 2 rows (2 priced)" in res.output
    assert (tmp_path / "cache" / "catalog" / "vast.csv").is_file()
    show = _run(cli, ["catalog", "show"])
    assert show.exit_code == 0
    vast = next(line for line in show.output.splitlines() if line.strip("│ ").startswith("vast"))
    assert "cache" in vast and " no " in vast              # refreshed now: not stale
    ec2 = next(line for line in show.output.splitlines() if line.strip("│ ").startswith("ec2"))
    assert "shipped" in ec2 and "yes" in ec2
    bad = _run(cli, ["catalog", "refresh", "--provider", "oracle"])
    assert bad.exit_code == 1 and "no price adapter" in bad.output


def test_installed_command_runs_from_the_shipped_catalog(tmp_path: Path) -> None:
    env = dict(os.environ, FLOWMESH_CACHE_DIR=str(tmp_path), COLUMNS="250")
    proc = subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", *MEGAFLOW], capture_output=True,
                          text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"3\d\.\d% less", proc.stdout), proc.stdout


def test_cost_estimate_prices_megaflows_own_cloud_and_says_the_price_is_implied(cli: CliRunner) -> None:
    """issue 28: the shipped Alibaba rows carry the prices MegaFlow's totals imply, labelled as such."""
    res = _run(cli, ["cost", "estimate", "--tasks", "2000", "--minutes", "100"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "alibaba/unknown" in line)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[1] == "2000 x ecs.c8a.2xlarge" and cells[3] == f"{2000 * 0.3015:,.2f}", cells
    assert "prices: alibaba (ecs.c8a.2xlarge): IMPLIED by the MegaFlow paper's totals, NOT a list price" in res.output
    assert "alibaba (unknown): no feasible offer" not in res.output
