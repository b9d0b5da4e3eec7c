"""``flowmesh cost simulate``: the sweep through the real pools on the simulator, its
tables, its PNG, the centralized capacity ceiling, MegaFlow's 32 % replayed, bad input."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from flowmesh_sdk.cli.main import app

MEGAFLOW = ["--provider", "alibaba", "--instance", "ecs.c8a.2xlarge", "--centralized", "ecs.re6.52xlarge",
            "--price", "ecs.c8a.2xlarge=0.3015", "--price", "ecs.re6.52xlarge=20.045",
            "--minutes", "95", "--image-gb", "2"]


def test_sweep_prints_tables_and_writes_a_png(tmp_path):
    png = tmp_path / "scaling.png"
    res = CliRunner().invoke(app, ["cost", "simulate", "--tasks", "1,10,60", "--tasks-per-instance", "20",
                                   "--centralized-capacity", "2", "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    out = res.output
    assert "per-phase breakdown" in out and "env startup" in out
    # 60 tasks at 20 a machine need 3 centralized machines; only 2 exist
    assert re.search(r"60 .*centralized \(20/machine\).*no capacity", out), out
    assert re.search(r"10 .*distributed ephemeral\s+.\s+10 ", out), out     # one instance per task


def test_megaflow_replay_on_the_simulator_shows_about_32_percent(tmp_path):
    res = CliRunner().invoke(app, ["cost", "simulate", "--tasks", "2000", "--modes", "ephemeral,centralized",
                                   "--plot", "", *MEGAFLOW])
    assert res.exit_code == 0, res.output
    m = re.search(r"2,000 tasks: distributed ephemeral costs ([0-9.]+)% less than centralized", res.output)
    assert m, res.output
    assert abs(float(m.group(1)) - 32.0) <= 2.0      # the paper: $1,005 vs $1,470, 32 % less


def test_bad_input_names_the_option():
    for args, opt in ((["--tasks", "ten"], "--tasks"), (["--tasks", "0"], "--tasks"),
                      (["--modes", "serverless"], "--modes"), (["--instance", "nope.large"], "--instance")):
        res = CliRunner().invoke(app, ["cost", "simulate", "--plot", "", *args])
        assert res.exit_code != 0 and opt in res.output, (args, res.output)
    # refused before anything is printed (the workload's own check came after the preamble)
    for args, opt in ((["--minutes", "-1"], "--minutes"), (["--image-gb", "-2"], "--image-gb"),
                      (["--tasks-per-instance", "0"], "--tasks-per-instance"),
                      (["--centralized-capacity", "0"], "--centralized-capacity")):
        res = CliRunner().invoke(app, ["cost", "simulate", "--plot", "", "--tasks", "10", *args])
        assert res.exit_code == 1 and opt in res.output and "simulating" not in res.output, (args, res.output)
