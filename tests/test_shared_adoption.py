"""A shared fleet's instances outlive the coordinator that launched them: a real Fleet
in its own OS process (tests/_fleet_victim.py: a persistent local pool holding an open
sandbox) is SIGKILLed; a coordinator of the same fleet adopts it and reclaims its
instance (terminated, its container removed, its charge ended, recorded in the store and
the shared stream); ``flowmesh gc`` on the shared state never takes an instance a live
coordinator holds -- even when the process that launched it is dead -- and takes it once
its holder is gone, recording the removal in Redis.  Real redis-server, podman, SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from flowmesh_providers.local import LocalProvider
from typer.testing import CliRunner

from flowmesh_sdk import Fleet
from flowmesh_sdk.cli.main import app
from flowmesh_sdk.control.events import EventKind
from flowmesh_sdk.control.redis import RedisBackend
from flowmesh_sdk.provider import LABEL_INSTANCE
from conftest import podman_names  # noqa: E402

pytest_plugins = ("_redis",)   # the redis_server fixture

ROOT = Path(__file__).resolve().parents[1]
LEASE_S = 1.0


def start_victim(url: str, home: Path, fleet: str, image: str) -> tuple[subprocess.Popen[str], str, str]:
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_fleet_victim.py"), url, str(home), fleet, image],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline().split()
    if not line or line[0] != "ready":
        p.kill()
        pytest.fail(f"victim did not start: {line} {p.stderr.read()[-2000:] if p.stderr else ''}")
    return p, line[1], line[2]


def kill(p: subprocess.Popen[str]) -> None:
    p.send_signal(signal.SIGKILL)
    assert p.wait(10) == -signal.SIGKILL


async def until(pred, timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await pred():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def fleet_on(url: str, home: Path, name: str) -> Fleet:
    return Fleet(name, home=home, control=RedisBackend(url, fleet=name, lease_s=LEASE_S), reconcile_interval_s=None,
                 providers={"local": LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local" / "instances")})


async def test_adopter_reclaims_a_killed_coordinators_instance(redis_server, fm_home, busybox_image):
    victim, inst, dead = start_victim(redis_server.url, fm_home, "adopt", busybox_image)
    assert podman_names(f"{LABEL_INSTANCE}={inst}")          # its sandbox runs
    adopter = fleet_on(redis_server.url, fm_home, "adopt")
    await adopter.start()
    try:
        shared = await adopter.control.shared_instances("adopt")
        assert shared is not None and [(i.id, i.holder) for i in shared.instances] == [(inst, dead)]
        kill(victim)
        prov = adopter.provider("local")

        async def reclaimed() -> bool:
            return not adopter._reclaims and bool(adopter.control.coordinator.adoptions) \
                and not await prov.describe([inst])
        await until(reclaimed, 15 * LEASE_S, "the adopter to reclaim the dead coordinator's instance")
        (adoption,) = adopter.control.coordinator.adoptions
        assert adoption.dead == dead and [i.id for i in adoption.adopted] == [inst]
        assert not podman_names(f"{LABEL_INSTANCE}={inst}")   # its sandbox's container is gone too
        assert (await adopter.control.shared_instances("adopt")).instances == ()
        await adopter.ledger.refresh()
        assert adopter.spend().burn_per_hour == 0              # its charge ended, fleet-wide
        await adopter.store.flush()
        rows = {r.id: r for r in adopter.store.instances()}
        assert rows[inst].state == "terminated"
        stream = [e.event for e in await adopter.control.events("adopt").tail(200)]
        assert any(e.kind is EventKind.INSTANCE_TERMINATED and e.instance_id == inst
                   and f"its coordinator {dead} died" in e.detail for e in stream)
    finally:
        if victim.poll() is None:
            victim.kill()
        await adopter.close()
        await adopter.control.close()


async def test_gc_on_a_shared_fleet_spares_what_a_live_coordinator_holds(redis_server, fm_home, busybox_image,
                                                                         monkeypatch):
    monkeypatch.setenv("FLOWMESH_STATE", redis_server.url)
    victim, inst, dead = start_victim(redis_server.url, fm_home, "held", busybox_image)
    # another coordinator of the fleet adopts it (only a coordinator of the same fleet can):
    # it holds the instance now, but cannot reclaim it -- its local provider's state is
    # elsewhere (another home), so the slice is not visible from it
    other = fleet_on(redis_server.url, fm_home / "other", "held")
    await other.start()
    runner = CliRunner()

    def gc(*args: str) -> dict:
        res = runner.invoke(app, ["gc", "--fleet", "held", "--json", *args])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    try:
        kill(victim)

        async def adopted() -> bool:
            s = await other.control.shared_instances("held")
            return [(i.id, i.holder) for i in s.instances] == [(inst, other.control.coordinator.id)]
        await until(adopted, 15 * LEASE_S, "another coordinator to adopt the dead one")
        # the owner tag names a dead process, but a live coordinator holds it: not taken
        found = (await asyncio.to_thread(gc))["found"]
        assert found["instances"] == [] and found["containers"] == []
    finally:
        await other.close()
        await other.control.close()      # leaves cleanly: what it held has no live holder now
    found = (await asyncio.to_thread(gc))["found"]
    assert [(o["instance_id"], o["reason"]) for o in found["instances"]] == [
        (inst, f"its coordinator {other.control.coordinator.id} is gone (no lease)")]
    doc = await asyncio.to_thread(gc, "--yes")
    assert doc["result"]["terminated"] == [inst] and doc["result"]["still_present"] == []
    assert not podman_names(f"{LABEL_INSTANCE}={inst}")
    be = RedisBackend(redis_server.url)
    await be.client.ping()
    try:
        assert (await be.shared_instances("held")).instances == ()          # dropped from the fleet's list
        stream = [e.event for e in await be.events("held").tail(200)]
        assert any(e.kind is EventKind.INSTANCE_TERMINATED and e.instance_id == inst
                   and e.detail.startswith("terminated by gc") for e in stream)
    finally:
        await be.client.close()
    assert os.environ["FLOWMESH_STATE"] == redis_server.url
