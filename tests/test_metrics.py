"""The Prometheus endpoint of a fleet (flowmesh_sdk.observe.metrics), scraped over HTTP
after a real run on the local provider (podman) with an image pulled from a real
docker-registry on 127.0.0.1: every value is checked against the run's own events."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flowmesh_sdk import EventKind, Fleet, InstanceSpec, PoolSpec, SandboxSpec, Task
from flowmesh_sdk.errors import ThrottledError
from flowmesh_sdk.provisioning import Failover, RetryPolicy
from flowmesh_sdk.specs import Offer
from flowmesh_sdk.registry.local import LocalRegistry
from flowmesh_providers.local import LocalProvider


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    res = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(res.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(m: dict, name: str, **labels: str) -> float:
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


@pytest.fixture
def registry(busybox_image, tmp_path: Path):
    """A fresh image (busybox plus one layer) in a real registry, absent from this host's store."""
    (tmp_path / "data").write_text(uuid.uuid4().hex)
    (tmp_path / "Containerfile").write_text(f"FROM {busybox_image}\nCOPY data /data\n")
    local = f"localhost/fm19metrics/img:{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "build", "-q", "--pull=never", "-t", local, str(tmp_path)], check=True,
                   capture_output=True)
    with LocalRegistry() as reg:
        ref = reg.push(local, "fm19metrics/img:1")
        subprocess.run(["podman", "rmi", local], check=True, capture_output=True)
        yield reg, ref
        host = reg.host
    ids = subprocess.run(["podman", "images", "-q", "--filter", f"reference={host}/*/*"],
                         capture_output=True, text=True).stdout.split()
    if ids:
        subprocess.run(["podman", "rmi", "-f", *set(ids)], capture_output=True)


async def test_scrape_after_a_real_run_matches_the_events(fm_home: Path, registry) -> None:
    reg, ref = registry
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "local" / "instances")
    fleet = Fleet("metrics", home=fm_home, providers={"local": provider}, metrics_port=0,
                  retry_policy=RetryPolicy(attempts=3, backoff_s=0.01, backoff_max_s=0.02))
    events: list = []
    fleet.bus.on(events.append)
    try:
        assert fleet.metrics is not None and fleet.metrics.port
        port = fleet.metrics.port
        pool = await fleet.pool(PoolSpec(name="scraped", instance=InstanceSpec(cpus=1, memory_gb=2),
                                         max_instances=1, sandboxes_per_instance=2, warm_per_image=0))
        spec = SandboxSpec(image=ref, cpus=0.5, memory_gb=0.25)
        results = await pool.map([Task(name=f"ok{i}", sandbox=spec, command=f"echo {i}") for i in range(2)]
                                 + [Task(name="bad", sandbox=spec, command="exit 3")])
        assert sorted(r.result.exit_code for r in results) == [0, 0, 3]

        # a throttled provider call, retried by the provisioner: a stand-in cloud call that
        # raises ThrottledError once (the local provider never throttles)
        calls = []

        async def flaky() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise ThrottledError("Rate exceeded (stand-in)", provider="local", code="Throttling")
            return "ok"
        assert await fleet.provisioner.call(provider, "host", "describe", flaky) == "ok"
        # a failover, as the provisioner reports it (published by the fleet's own hook)
        offer = Offer(provider="local", region="host", instance_type="c1", cpus=1, memory_gb=2, price_per_hour=0.0)
        fleet.provisioner.on_failover(Failover(pool="scraped", offer=offer, reason="capacity",
                                               error="no room", price_delta=0.0), None)

        m = scrape(port)
        events = list(events)    # what had happened at the scrape (the close adds more)
    finally:
        await fleet.close(timeout_s=30)

    kinds = Counter(e.kind for e in events)
    ended = [e for e in events if e.kind in (EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED)]
    assert value(m, "flowmesh_tasks_total", pool="scraped", outcome="succeeded") == 2
    assert value(m, "flowmesh_tasks_total", pool="scraped", outcome="failed") == 1
    for phase in ("queued", "scheduling", "env_startup", "execution", "teardown"):
        assert value(m, "flowmesh_task_phase_seconds_count", pool="scraped", phase=phase) == 3
        assert value(m, "flowmesh_task_phase_seconds_sum", pool="scraped", phase=phase) == pytest.approx(
            sum(getattr(e.phases, phase) for e in ended), rel=1e-6, abs=1e-9)
    assert value(m, "flowmesh_task_phase_seconds_sum", phase="execution") > 0
    # every event counted by kind
    for kind, n in kinds.items():
        assert value(m, "flowmesh_events_total", kind=kind.value) == n, kind
    # instances: launched on local, one live and ready at the scrape
    assert value(m, "flowmesh_launches_total", pool="scraped", provider="local") == kinds[EventKind.INSTANCE_REQUESTED] == 1
    assert value(m, "flowmesh_instances", pool="scraped", provider="local", state="ready") == 1
    assert value(m, "flowmesh_instance_transitions_total", state="ready") == kinds[EventKind.INSTANCE_READY]
    boot = [e for e in events if e.kind is EventKind.INSTANCE_READY][0].bootstrap
    assert value(m, "flowmesh_bootstrap_step_seconds_count") == len(boot.steps)
    # pulls and bytes, from the image.pulled events of the real registry pull
    pulled = [e for e in events if e.kind is EventKind.IMAGE_PULLED]
    assert len(pulled) == 1
    size = int(re.search(r"image size (\d+) bytes", pulled[0].detail).group(1))
    assert value(m, "flowmesh_image_pulls_total", pool="scraped") == 1
    assert value(m, "flowmesh_image_pull_bytes_total", pool="scraped") == size > 0
    assert value(m, "flowmesh_image_pull_seconds_count", pool="scraped") == 1
    # the throttle and the failover
    assert value(m, "flowmesh_provider_retries_total", provider="local", api="describe", reason="throttled") == 1
    assert value(m, "flowmesh_launch_failovers_total", pool="scraped", provider="local", reason="capacity") == 1
    # spend and burn: what the fleet's ledger says (the local provider is free)
    spent = fleet.ledger.summary(pool="scraped")
    assert value(m, "flowmesh_spend_usd_total", pool="scraped", provider="local") == pytest.approx(spent.spent)
    assert ("flowmesh_burn_rate_usd_per_hour" in m)
    # bounded cardinality: no task or instance id in any label value
    ids = {e.task_id for e in events if e.task_id} | {e.instance_id for e in events if e.instance_id}
    labels = {v for samples in m.values() for lab, _ in samples for v in lab.values()}
    assert not (ids & labels)
    # the endpoint went away with the fleet
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_serve_metrics_from_the_store(tmp_path: Path) -> None:
    """``flowmesh serve-metrics --once`` prints what a FLOWMESH_HOME's store says."""
    from flowmesh_sdk.control.events import Event, EventBus
    from flowmesh_sdk.control.store import MetadataStore
    from flowmesh_sdk.specs import PhaseTimings

    store = MetadataStore(tmp_path / "flowmesh.db")
    bus = EventBus()
    store.attach(bus)
    bus.publish(Event(EventKind.POOL_CREATED, fleet="f", pool="p", detail='{"mode": "persistent"}'))
    for i, kind in enumerate((EventKind.TASK_SUCCEEDED, EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED)):
        bus.publish(Event(EventKind.TASK_SUBMITTED, fleet="f", pool="p", task_id=f"t{i}", task_name=f"t{i}"))
        bus.publish(Event(kind, fleet="f", pool="p", task_id=f"t{i}", task_name=f"t{i}",
                          phases=PhaseTimings(execution=1.5)))
    asyncio.run(store.flush())
    store.close()
    res = subprocess.run([sys.executable, "-m", "flowmesh_sdk", "serve-metrics", "--once"], capture_output=True,
                         text=True, env={**os.environ, "FLOWMESH_HOME": str(tmp_path)}, timeout=60)
    assert res.returncode == 0, res.stderr
    samples = [s for f in text_string_to_metric_families(res.stdout) for s in f.samples]
    tasks = {s.labels["state"]: s.value for s in samples if s.name == "flowmesh_store_tasks"}
    assert tasks == {"succeeded": 2, "failed": 1}
    (exec_s,) = [s.value for s in samples if s.name == "flowmesh_store_task_phase_seconds_total"
                 and s.labels["phase"] == "execution"]
    assert exec_s == pytest.approx(4.5)


def test_a_metrics_port_in_use_is_named_and_leaves_nothing_open(tmp_path: Path) -> None:
    """A port another server holds: ``Fleet(metrics_port=...)`` raises a SpecError naming the
    field and the reason, having closed the store it opened (no writer thread left), and
    ``flowmesh serve-metrics`` says the same and exits 1 (both were tracebacks)."""
    import socket
    import threading

    from flowmesh_sdk.errors import SpecError
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        before = {t.ident for t in threading.enumerate()}
        with pytest.raises(SpecError, match=rf"metrics_port: cannot serve metrics on 127.0.0.1:{port}: "
                                            "Address already in use"):
            Fleet("busy", home=tmp_path, metrics_port=port)
        assert {t.ident for t in threading.enumerate()} <= before
        env = {**os.environ, "FLOWMESH_HOME": str(tmp_path)}
        for args, code, said in ((["--port", str(port)], 1, "Address already in use"),
                                 (["--addr", "192.0.2.1"], 1, "192.0.2.1:9464: Cannot assign requested address"),
                                 (["--port", "70000"], 2, "65535")):
            res = subprocess.run([sys.executable, "-m", "flowmesh_sdk", "serve-metrics", *args], capture_output=True,
                                 text=True, env=env, timeout=60)
            assert res.returncode == code and said in res.stderr and "Traceback" not in res.stderr, res.stderr
