"""The pool's heartbeat (flowmesh_sdk/pools/heartbeat.py) on real OpenSSH sshd hosts on
loopback addresses: a host frozen mid-task (its sshd processes SIGSTOPped, so its TCP
connections stay open and nothing answers: no FIN, no RST) is given up within the
documented bound and its task runs again, once, on the other host; with the heartbeat
off no probe reaches a host; bad settings are refused naming the field."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from flowmesh_sdk import EventKind, Fleet, InfraFailure, InstanceSpec, PoolSpec, SandboxSpec, SpecError, Task
from flowmesh_sdk.registry.local import LocalRegistry

pytest.importorskip("paramiko")

from flowmesh_providers.ssh import SshHost, SshProvider  # noqa: E402
from flowmesh_sdk.testing.sshd import LoopbackSshd, _children  # noqa: E402

HEARTBEAT_S = 1.0
MISSES = 2


def _host(name: str, d: LoopbackSshd) -> SshHost:
    return SshHost(name=name, host=d.host, port=d.port, user=d.user, key_path=d.client_key_path,
                   host_key=d.host_public_key, cpus=2, memory_gb=4)


def _sshd_tree(root: int) -> list[int]:
    """The listener and every sshd process under it (per-connection and privilege-separated
    children); what the sessions run (podman exec, the containers) is left alone."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("sshd"):
            out.append(pid)
            todo += _children(pid)
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def test_a_frozen_host_is_given_up_within_the_bound_and_its_task_runs_once_elsewhere(
        fm_home, busybox_image):
    with LoopbackSshd("127.0.0.161", startup_timeout_s=30) as a, \
            LoopbackSshd("127.0.0.162", startup_timeout_s=30) as b, LocalRegistry() as reg:
        image = reg.push(busybox_image, "hb/busybox:1")
        sshds = {"a": a, "b": b}
        prov = SshProvider([_host("a", a), _host("b", b)], state_dir=fm_home / "ssh")
        frozen: list[int] = []
        try:
            async with Fleet("hb", home=fm_home, providers={"ssh": prov}) as fleet:
                seen: list[tuple[float, object]] = []
                fleet.bus.on(lambda e: seen.append((time.monotonic(), e)), EventKind.INSTANCE_FAILED,
                             EventKind.TASK_REDISPATCHED, EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED)
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=2, max_instances=2,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2),
                                                 warm_per_image=0, warm_images=(image,),
                                                 heartbeat_s=HEARTBEAT_S, heartbeat_misses=MISSES))
                hb = pool.machines.heartbeat
                assert hb is not None and hb.bound_s == HEARTBEAT_S * (MISSES + 1)
                # the task would wait for its answer up to timeout_s + 15 s without the heartbeat
                task = Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                            command="sleep 4; echo first", timeout_s=300)
                started = asyncio.ensure_future(fleet.bus.wait_for(
                    lambda e: e.kind is EventKind.TASK_STARTED, 60))
                running = asyncio.ensure_future(pool.run_task(task))
                first = await started
                doomed = pool.instances[first.instance_id].instance.address
                probes_before = hb.probes
                frozen = _sshd_tree(sshds[doomed]._proc.pid)
                assert len(frozen) >= 2, frozen   # the listener and the connection's processes
                _signal(frozen, signal.SIGSTOP)
                t_frozen = time.monotonic()
                res = await asyncio.wait_for(running, 120)
                t_done = time.monotonic()
                assert res.ok, res.error
                assert res.result.stdout == "first\n"
                assert (res.attempts, res.infra_failure, res.cost) == (2, None, 0.0)   # SSH hosts: no price
                survivor = next(mi for mi in pool.instances.values() if mi.instance.address != doomed)
                assert res.instance_id == survivor.id != first.instance_id
                failed = [(t, e) for t, e in seen if e.kind is EventKind.INSTANCE_FAILED]
                assert [e.instance_id for _, e in failed] == [first.instance_id]
                detail = failed[0][1].detail
                assert detail.startswith("heartbeat: no answer from ") and f"({MISSES} misses)" in detail, detail
                # within the bound (a generous multiple of it: the machine is loaded), and long
                # before the task's own deadline would have noticed
                print(f"given up {failed[0][0] - t_frozen:.2f} s after the freeze (bound {hb.bound_s:g} s); "
                      f"task done {t_done - t_frozen:.2f} s after it")
                assert failed[0][0] - t_frozen < 5 * hb.bound_s + 5, (failed[0][0] - t_frozen, hb.bound_s)
                assert t_done - t_frozen < 60
                assert hb.probes > probes_before
                redispatched = [e for _, e in seen if e.kind is EventKind.TASK_REDISPATCHED]
                assert [e.task_id for e in redispatched] == [res.task_id]        # once
                assert redispatched[0].instance_id == first.instance_id
                ends = [e for _, e in seen if e.kind in (EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED)]
                assert [(e.kind, e.task_id) for e in ends] == [(EventKind.TASK_SUCCEEDED, res.task_id)]
                rows = [r for r in fleet.store.tasks() if r.id == res.task_id]
                assert len(rows) == 1 and rows[0].state == "succeeded"
                _signal(frozen, signal.SIGCONT)   # before the drain, so the host's slice is cleared
                frozen = []
            assert not pool.machines.heartbeat._beats   # the probe loops ended with the pool
        finally:
            _signal(frozen, signal.SIGCONT)
            await prov.close()   # each host's containers go with its storage (LoopbackSshd's exit)


async def test_a_host_frozen_under_a_task_with_no_retry_left_ends_it_instance_lost(fm_home, busybox_image):
    with LoopbackSshd("127.0.0.165", startup_timeout_s=30) as d, LocalRegistry() as reg:
        image = reg.push(busybox_image, "hb/busybox:1")
        prov = SshProvider([_host("d", d)], state_dir=fm_home / "ssh")
        frozen: list[int] = []
        try:
            async with Fleet("hb", home=fm_home, providers={"ssh": prov}) as fleet:
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1, max_instances=1,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2), warm_per_image=0,
                                                 warm_images=(image,), heartbeat_s=HEARTBEAT_S,
                                                 heartbeat_misses=MISSES, retry_infra_failures=0))
                task = Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                            command="sleep 30; echo never", timeout_s=300)
                started = asyncio.ensure_future(fleet.bus.wait_for(lambda e: e.kind is EventKind.TASK_STARTED, 60))
                running = asyncio.ensure_future(pool.run_task(task))
                await started
                frozen = _sshd_tree(d._proc.pid)
                _signal(frozen, signal.SIGSTOP)
                res = await asyncio.wait_for(running, 120)
                assert (res.infra_failure, res.attempts, res.result) == (InfraFailure.INSTANCE_LOST, 1, None), res
                assert not res.ok and "InstanceLost" in (res.error or "")
                (row,) = [r for r in fleet.store.tasks() if r.id == res.task_id]
                _signal(frozen, signal.SIGCONT)
                frozen = []
            assert (row.state, row.infra_failure) == ("failed", "instance_lost")
        finally:
            _signal(frozen, signal.SIGCONT)
            await prov.close()


@pytest.mark.parametrize("moment", [EventKind.INSTANCE_FAILED, EventKind.SANDBOX_CLOSED])
async def test_a_task_cancelled_as_the_heartbeat_gives_its_host_up_is_not_dispatched_again(
        fm_home, busybox_image, moment):
    """Cancelled the moment its instance is given up (the abort's error has not reached it
    yet), or while its sandbox is torn down after the loss (the error has: it was about to
    be queued again): either way it ends cancelled, published once, and runs nowhere."""
    with LoopbackSshd("127.0.0.164", startup_timeout_s=30) as d, LocalRegistry() as reg:
        image = reg.push(busybox_image, "hb/busybox:1")
        prov = SshProvider([_host("d", d)], state_dir=fm_home / "ssh")
        frozen: list[int] = []
        try:
            async with Fleet("hbcancel", home=fm_home, providers={"ssh": prov}) as fleet:
                seen: list = []
                fleet.bus.on(seen.append, EventKind.INSTANCE_FAILED, EventKind.TASK_REDISPATCHED,
                             EventKind.TASK_CANCELLED, EventKind.TASK_SUCCEEDED, EventKind.TASK_FAILED,
                             EventKind.TASK_STARTED)
                pool = await fleet.pool(PoolSpec(name="p", provider="ssh", min_instances=1,
                                                 instance=InstanceSpec(cpus=2, memory_gb=2),
                                                 warm_per_image=0, warm_images=(image,),
                                                 heartbeat_s=HEARTBEAT_S, heartbeat_misses=MISSES))
                task = Task(name="t", sandbox=SandboxSpec(image=image, cpus=1, memory_gb=0.25),
                            command="sleep 30", timeout_s=300)
                started = asyncio.ensure_future(fleet.bus.wait_for(
                    lambda e: e.kind is EventKind.TASK_STARTED, 60))
                running = asyncio.ensure_future(pool.run_task(task))
                await started
                fleet.bus.on(lambda e: running.cancel(), moment)
                frozen = _sshd_tree(d._proc.pid)
                _signal(frozen, signal.SIGSTOP)
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(running, 60)
                kinds = [e.kind for e in seen]
                assert kinds == [EventKind.TASK_STARTED, EventKind.INSTANCE_FAILED, EventKind.TASK_CANCELLED], kinds
                assert seen[1].detail.startswith("heartbeat: no answer from ")
                await asyncio.sleep(2 * HEARTBEAT_S)
                assert [e.kind for e in seen] == kinds   # nothing ran it again
                _signal(frozen, signal.SIGCONT)
                frozen = []
        finally:
            _signal(frozen, signal.SIGCONT)
            await prov.close()


async def test_heartbeat_off_sends_no_probe_and_bad_settings_name_the_field(fm_home):
    def sessions(d: LoopbackSshd) -> int:
        return d.log_text().count("Starting session:")

    with LoopbackSshd("127.0.0.163", startup_timeout_s=30) as d:
        prov = SshProvider([_host("c", d)], state_dir=fm_home / "ssh")
        try:
            async with Fleet("hboff", home=fm_home, providers={"ssh": prov}) as fleet:
                counts = {}
                for name, beat in (("off", None), ("on", 0.5)):
                    pool = await fleet.pool(PoolSpec(name=name, provider="ssh", min_instances=1,
                                                     instance=InstanceSpec(cpus=2, memory_gb=2),
                                                     warm_per_image=0, heartbeat_s=beat))
                    assert (pool.machines.heartbeat is None) == (beat is None)
                    await asyncio.sleep(0.5)   # bootstrap's last sessions are logged
                    before = sessions(d)
                    await asyncio.sleep(3.0)
                    counts[name] = sessions(d) - before
                    await pool.drain()
                assert counts["off"] == 0, counts
                assert counts["on"] >= 3, counts      # every 0.5 s: the count above can see probes
        finally:
            await prov.close()
    for field, kw in (("pool.heartbeat_s", {"heartbeat_s": 0}), ("pool.heartbeat_s", {"heartbeat_s": "10"}),
                      ("pool.heartbeat_s", {"heartbeat_s": float("inf")}),
                      ("pool.heartbeat_misses", {"heartbeat_misses": 0}),
                      ("pool.heartbeat_misses", {"heartbeat_misses": 1.5})):
        with pytest.raises(SpecError) as err:
            PoolSpec(name="p", **kw)
        assert err.value.field == field, (kw, err.value)
