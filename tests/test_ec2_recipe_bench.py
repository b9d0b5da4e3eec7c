"""recipes/ec2_swe_rollouts.py and bench/provider_calls.py, run for real against moto's EC2
on 127.0.0.1 (the recipe's --emulator runs its sandboxes on this host with podman and the
SWE image).  Nothing here talks to an address outside 127.0.0.0/8: the subprocesses get
no AWS credentials and the instance metadata service is switched off for boto3."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk.testing.ec2fault import Ec2FaultProxy
from flowmesh_sdk.testing.moto import MotoEc2
from flowmesh_sdk.catalog import Catalog

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "ec2_swe_rollouts.py"
BENCH = ROOT / "bench" / "provider_calls.py"
REGION = "us-east-1"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("AWS_") and k not in ("FLOWMESH_EC2_ENDPOINT_URL", "FLOWMESH_EC2_AMI")}
    env.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
               AWS_SHARED_CREDENTIALS_FILE=os.devnull, NO_PROXY="127.0.0.1,localhost",
               no_proxy="127.0.0.1,localhost",
               FLOWMESH_CACHE_DIR=str(ROOT / ".no-catalog-cache"))   # the shipped catalog, never a refreshed one
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _snapshot_rows() -> list[dict[str, str]]:
    """The catalog's shipped EC2 snapshot (the one source of prices), as CSV records."""
    text = (ROOT / "providers" / "ec2" / "catalog.csv").read_text()
    return [r for r in csv.DictReader(io.StringIO(text)) if r["region"] == REGION]


def _on_demand(instance_type: str) -> float:
    row = next(r for r in Catalog.load(["ec2"], use_cache=False, warn=False).rows
               if (r.region, r.instance_type) == (REGION, instance_type))
    assert row.on_demand_per_hour is not None
    return row.on_demand_per_hour


def _plan_line(stdout: str) -> dict[str, str]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("plan: "))
    return dict(kv.split("=", 1) for kv in line.removeprefix("plan: ").split())


@pytest.fixture(scope="module")
def moto_proxy():
    with MotoEc2() as moto, Ec2FaultProxy(moto.endpoint_url) as proxy:
        yield moto, proxy


# ---- the plan --------------------------------------------------------------------------------
def test_dry_run_prints_the_plan_without_any_api_call(moto_proxy):
    _, proxy = moto_proxy
    before = sum(proxy.calls.values())
    # an endpoint that counts every request: the dry run must send none
    proc = _run([str(RECIPE), "--dry-run", "--tasks", "10", "--sandboxes-per-instance", "2",
                 "--max-instances", "3", "--task-minutes", "2"],
                _env(FLOWMESH_EC2_ENDPOINT_URL=proxy.endpoint_url), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert sum(proxy.calls.values()) == before, proxy.calls
    assert "dry run: no API call was made" in out

    plan = _plan_line(out)
    # the chosen type is the cheapest snapshot row with >= 8 vCPU and >= 16 GiB (x86), on
    # demand (the snapshot has no spot prices: the spot default falls back, visibly)
    rows = [r for r in _snapshot_rows() if int(r["vcpus"]) >= 8 and float(r["memory_gib"]) >= 16
            and not re.match(r"^[a-z]+\d+g", r["instance_type"])]
    cheapest = min(rows, key=lambda r: (float(r["price_hour_usd"]), r["instance_type"]))
    assert not any(r["spot_price_hour_usd"] for r in rows)
    assert "FALLING BACK TO ON-DEMAND" in out
    assert plan["type"] == cheapest["instance_type"] and plan["market"] == "on-demand"
    price = _on_demand(plan["type"])
    assert float(plan["price_per_hour"]) == pytest.approx(price)
    # 3 = min(3, ceil(10 / 2)); waves = ceil(10 / (3 * 2)) = 2; 2 x 2 min = 1/15 h
    assert plan["count"] == "3"
    hours = 2 * 2 / 60
    assert float(plan["hours"]) == pytest.approx(hours, abs=1e-4)
    cost = 3 * price * hours
    assert float(plan["cost_usd"]) == pytest.approx(cost, abs=1e-4)
    assert f"chosen instance type: {plan['type']} (on-demand, 8 vCPU, 16 GiB) at ${price:.4f}/h" in out
    assert "instances: 3 = min(--max-instances 3, ceil(10 tasks / 2 sandboxes per instance))" in out
    assert f"estimated cost: 3 instances x ${price:.4f}/h x {hours:.4f} h = ${cost:.4f}" in out
    # the launch-rate arithmetic for 10,000 instances: (10000 - 1000) / 2 s
    assert re.search(r"10000 instances: 10 RunInstances call\(s\).*4500 s \(75\.0 min\)", out), out


def test_dry_run_counts_launch_calls_beyond_one_batch():
    proc = _run([str(RECIPE), "--dry-run", "--on-demand", "--tasks", "5000", "--sandboxes-per-instance",
                 "2", "--max-instances", "2500"], _env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = _plan_line(proc.stdout)
    assert plan["count"] == "2500" and plan["market"] == "on-demand"
    assert float(plan["launch_s"]) == (2500 - 1000) / 2      # the instance bucket, 2/s after 1000
    assert "FALLING BACK" not in proc.stdout


def test_run_without_endpoint_or_ami_refuses_before_any_call():
    proc = _run([str(RECIPE), "--tasks", "1"], _env(), timeout=120)
    assert proc.returncode == 2
    assert "--endpoint-url" in proc.stdout and "--ami" in proc.stdout
    proc = _run([str(RECIPE), "--tasks", "1", "--endpoint-url", "https://ec2.us-east-1.amazonaws.com",
                 "--ami", "ami-0123456789abcdef0"], _env(), timeout=120)
    assert proc.returncode == 2 and "nothing was launched" in proc.stdout
    assert "not a loopback address" in proc.stdout and "SSH mode" in proc.stdout
    assert "API calls of this run" not in proc.stdout   # refused before any provider was built


_PARSE = ("import json, runpy, sys; m = runpy.run_path(sys.argv[1]); "
          "print(json.dumps(vars(m['parse_args'](sys.argv[2:]))))")


def _parsed(*args: str) -> subprocess.CompletedProcess[str]:
    """The recipe's own parse_args on ``args`` (no plan, no run), in a fresh interpreter."""
    return _run(["-c", _PARSE, str(RECIPE), *args], _env(), timeout=120)


def test_emulator_and_moto_are_one_option():
    runs = {flags: _parsed(*flags) for flags in [(), ("--emulator",), ("--moto",),
                                                 ("--moto", "--inject-capacity-error"),
                                                 ("--emulator", "--inject-capacity-error")]}
    for flags, proc in runs.items():
        assert proc.returncode == 0, (flags, proc.stderr[-2000:])
    got = {flags: json.loads(proc.stdout.strip().splitlines()[-1]) for flags, proc in runs.items()}
    assert got[()]["emulator"] is False and "moto" not in got[()]
    assert got[("--emulator",)]["emulator"] is True
    assert got[("--moto",)] == got[("--emulator",)]          # the same option, not two
    assert got[("--moto", "--inject-capacity-error")] == got[("--emulator", "--inject-capacity-error")]
    proc = _parsed("--inject-capacity-error")
    assert proc.returncode == 2 and "--inject-capacity-error needs --emulator" in proc.stderr


# ---- end to end on moto ------------------------------------------------------------------------
def _fleet_of(stdout: str) -> str:
    m = re.search(r"flowmesh:fleet=(ec2swe-[0-9a-f]+)", stdout)
    assert m, stdout[-3000:]
    return m.group(1)


def _assert_clean(stdout: str) -> None:
    fleet = _fleet_of(stdout)
    assert f"nothing left: the provider lists no live instance tagged flowmesh:fleet={fleet}" in stdout
    ps = subprocess.run(["podman", "ps", "-a", "-q", "--filter", f"label=flowmesh.fleet={fleet}"],
                        capture_output=True, text=True, check=True).stdout.split()
    assert ps == [], f"containers left behind: {ps}"
    reg = re.search(r"registry: (127\.0\.0\.1:\d+)", stdout)
    assert reg, stdout[-3000:]
    left = subprocess.run(["podman", "images", "-q", "--filter", f"reference={reg.group(1)}/*/*"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert left == []


def _instance_rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in re.split(r"[│|]", ln)[1:-1]] for ln in stdout.splitlines()
            if re.match(r"^[│|] i-[0-9a-f]+ ", ln)]


@pytest.mark.slow
def test_moto_end_to_end(tmp_path, swe_image):
    proc = _run([str(RECIPE), "--emulator", "--tasks", "2"], _env(FLOWMESH_HOME=str(tmp_path / "fm")))
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert "STAND-IN" in out and "THIS host" in out
    assert "every verdict matched its expectation" in out
    # 2 tasks, 2 sandboxes per instance: one instance of the planned type, on demand
    plan = _plan_line(out)
    assert plan["count"] == "1"
    rows = _instance_rows(out)
    assert len(rows) == 1, out[-4000:]
    iid, itype, market, price = rows[0][:4]
    assert itype == plan["type"] and market == "on-demand" and rows[0][-1] == "on-demand"
    assert float(price) == pytest.approx(_on_demand(itype))
    # both tasks ran on it, and each verdict row says which
    assert len(re.findall(rf"│ t0[01]-\S+ .* {iid} ", out)) == 2, out[-4000:]
    assert "LAUNCH_FAILOVER events: none" in out
    assert re.search(r"RunInstances 1\b", out) and re.search(r"TerminateInstances 1\b", out)
    _assert_clean(out)


@pytest.mark.slow
def test_moto_spot_with_failover(tmp_path, swe_image):
    """A catalog with spot prices: the pool's spot preference ('prefer') uses the spot
    offers (moto records the spot lifecycle), and an injected InsufficientInstanceCapacity
    fails over to the next one."""
    rows = {r["instance_type"]: r for r in _snapshot_rows()}
    buf = io.StringIO()
    fields = list(next(iter(rows.values())).keys())
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    for t in ("c6a.2xlarge", "c5.2xlarge", "c6i.2xlarge"):
        w.writerow({**rows[t], "spot_price_hour_usd": f"{float(rows[t]['price_hour_usd']) * 0.4:.4f}"})
    prices = tmp_path / "spot.csv"
    prices.write_text(buf.getvalue())
    proc = _run([str(RECIPE), "--emulator", "--tasks", "2", "--prices", str(prices), "--inject-capacity-error"],
                _env(FLOWMESH_HOME=str(tmp_path / "fm")))
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    plan = _plan_line(out)
    assert plan["type"] == "c6a.2xlarge" and plan["market"] == "spot" and "FALLING BACK" not in out
    assert "1 LAUNCH_FAILOVER event(s)" in out
    assert re.search(r"ec2/us-east-1/c6a\.2xlarge spot capacity: .*InsufficientInstanceCapacity.* -> "
                     r"ec2/us-east-1/c5\.2xlarge \(\+0\.0136 \$/h\)", out), out[-4000:]
    (row,) = _instance_rows(out)
    assert row[1] == "c5.2xlarge" and row[2] == "spot" and row[-1] == "spot"   # moto's InstanceLifecycle
    assert float(row[3]) == pytest.approx(0.136)
    assert "every verdict matched its expectation" in out
    _assert_clean(out)


# ---- the benchmark -----------------------------------------------------------------------------
def test_bench_provider_calls():
    # 100 instances, not 50: the SDK path spends three fixed calls (RunInstances, the launch's
    # idempotency DescribeInstances, list_tagged), and 3 / 50 = 0.06 is above the 0.05 target
    n = 100
    proc = _run([str(BENCH), "--instances", str(n), "--naive-instances", "10"], _env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    m = re.fullmatch(r"api_calls_per_instance=(\d+\.\d{3})", lines[-1])
    assert m, f"bad last line: {lines[-1]!r}"
    x = float(m.group(1))
    assert x <= 0.05
    calls = re.search(r"SDK launch \+ describe: (\d+) RunInstances \+ (\d+) DescribeInstances .* \+ "
                      r"(\d+) DescribeInstances \(list_tagged\) = (\d+) calls for (\d+) instances",
                      proc.stdout.replace("\n", " "))
    assert calls, proc.stdout[-3000:]
    run, idem, listed, total, inst = map(int, calls.groups())
    assert run == math.ceil(n / 1000) and inst == n and total == run + idem + listed
    assert x == pytest.approx(round(total / n, 3))
    assert "naive path measured on 10 instances and extrapolated to 100" in proc.stdout
    side = next(ln for ln in lines if "launch + describe (RunInstances + DescribeInstances)" in ln)
    assert "2.0000" in side                                         # naive: one of each per instance


@pytest.mark.slow
def test_moto_run_that_cannot_launch_exits_non_zero(tmp_path, swe_image):
    """One offer only, and it answers InsufficientInstanceCapacity: the run fails visibly
    (exit 1), reports the failover, and still checks that nothing of the fleet is alive."""
    rows = {r["instance_type"]: r for r in _snapshot_rows()}
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows["c6a.2xlarge"].keys()))
    w.writeheader()
    w.writerow(rows["c6a.2xlarge"])
    prices = tmp_path / "one.csv"
    prices.write_text(buf.getvalue())
    proc = _run([str(RECIPE), "--emulator", "--tasks", "1", "--prices", str(prices), "--inject-capacity-error"],
                _env(FLOWMESH_HOME=str(tmp_path / "fm")))
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-3000:]
    assert "the run failed: CapacityError" in out and "AllOffersFailed" in out
    assert "1 LAUNCH_FAILOVER event(s)" in out and "-> none left" in out
    assert "RunInstances 1" in out
    _assert_clean(out)
