"""Snapshots through the public API: sb.snapshot() commits the sandbox's filesystem,
pushes it to the registry (conftest's snapshot_registry, a LocalRegistry on 127.0.0.1)
and returns a digest-pinned reference; a sandbox started from it in another pool (a
fresh instance) has the files and none of the processes.  Issue 13."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.remote.runtime import RuntimeConfig


@pytest.fixture(params=["busybox", "bash"])
def image(request, busybox_image, swe_image) -> str:
    return busybox_image if request.param == "busybox" else swe_image


async def test_snapshot_starts_elsewhere_with_the_files_not_the_processes(tmp_path, image, snapshot_registry):
    from flowmesh_providers.local import LocalProvider

    config = RuntimeConfig(snapshot_registry=snapshot_registry.host)
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=tmp_path / "local" / "instances",
                             runtime_config=config)
    async with Fleet("snap", home=tmp_path, providers={"local": provider}, runtime_config=config) as fleet:
        first = await fleet.pool(PoolSpec(name="snap-a", instance=InstanceSpec(cpus=1, memory_gb=2),
                                          min_instances=1, max_instances=1, warm_per_image=0))
        spec = SandboxSpec(image=image, cpus=0.5, memory_gb=0.25)
        async with first.sandbox(spec) as sb:
            await sb.write_file("/work/state/model.txt", "prepared\n")
            sh = sb.session()
            await sh.run("cd /work/state && echo step2 >> model.txt && export SECRET_STATE=1")
            server = await sb.start("exec sleep 1000")
            ref = await sb.snapshot()
            assert re.fullmatch(re.escape(snapshot_registry.host) + r"/flowmesh/snapshots@sha256:[0-9a-f]{64}", ref), ref
            assert server.returncode is None                 # the sandbox kept running
            assert (await sb.exec("cat /work/state/model.txt")).stdout == "prepared\nstep2\n"
            first_instance = sb.instance_id
        # the commit's local name is gone; the image lives under its digest in the registry
        names = subprocess.run(["podman", "images", "--format", "{{.Repository}}"], capture_output=True,
                               text=True, check=True).stdout
        assert "snapshot-work" not in names
        second = await fleet.pool(PoolSpec(name="snap-b", mode="ephemeral",
                                           instance=InstanceSpec(cpus=1, memory_gb=2),
                                           min_instances=0, max_instances=1))
        async with second.sandbox(SandboxSpec(image=ref, cpus=0.5, memory_gb=0.25)) as fork:
            assert fork.instance_id != first_instance
            assert (await fork.exec("cat /work/state/model.txt")).stdout == "prepared\nstep2\n"
            procs = (await fork.exec("for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f; echo; done")).stdout
            assert "sleep 1000" not in procs, procs
            r = await fork.session().run('pwd; echo "[$SECRET_STATE]"')
            assert r.stdout == "/\n[]\n"                      # no shell state either
            # the files keep the owners the first sandbox gave them, so root here can
            # write them (podman stores a user-namespaced container's host ids)
            owners = await fork.exec("stat -c '%u:%g %a' /work/state/model.txt /work/state")
            assert owners.stdout == "0:0 644\n0:0 755\n", owners
            wrote = await fork.exec("echo step3 >> /work/state/model.txt && tail -n 1 /work/state/model.txt")
            assert wrote.exit_code == 0 and wrote.stdout == "step3\n", wrote
        # a snapshot needs somewhere to go
        plain = Fleet("snap2", home=tmp_path / "h2",
                      providers={"local": LocalProvider(cpus=2, memory_gb=8,
                                                        state_dir=tmp_path / "h2" / "local")})
        async with plain:
            p = await plain.pool(PoolSpec(name="snap-c", instance=InstanceSpec(cpus=1, memory_gb=2),
                                          min_instances=1, max_instances=1, warm_per_image=0))
            async with p.sandbox(spec) as sb:
                with pytest.raises(SpecError, match="snapshot.registry"):
                    await sb.snapshot()


async def test_snapshot_keeps_sparse_files_sparse(tmp_path, busybox_image, snapshot_registry):
    """A 1 GiB sparse file (a few data blocks) stays sparse through snapshot and fork: the
    fork's copy has the same size, bytes and mtime, and holds kilobytes, not a gigabyte
    (podman writes every layer it commits or pulls in full; issue 24)."""
    from flowmesh_providers.local import LocalProvider

    config = RuntimeConfig(snapshot_registry=snapshot_registry.host)
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=tmp_path / "local" / "instances",
                             runtime_config=config)
    gib = 1 << 30
    make = ("mkdir -p /work/d && cd /work/d && truncate -s 1G sparse.img && "
            "printf head | dd of=sparse.img conv=notrunc 2>/dev/null && "
            f"printf mid | dd of=sparse.img bs=1 seek={gib // 2} conv=notrunc 2>/dev/null && "
            "printf tail >> sparse.img && touch -d '2020-01-02 03:04:05' sparse.img && "
            "ln sparse.img linked.img && dd if=/dev/zero of=zeros.bin bs=1024 count=64 2>/dev/null")
    look = ("cd /work/d && stat -c '%s %b %B %Y %h' sparse.img && head -c 4 sparse.img && "
            f"dd if=sparse.img bs=1 skip={gib // 2} count=3 2>/dev/null && tail -c 4 sparse.img && "
            "echo && stat -c '%i' sparse.img linked.img | uniq | wc -l && stat -c '%s' zeros.bin")
    async with Fleet("sparse", home=tmp_path, providers={"local": provider}, runtime_config=config) as fleet:
        first = await fleet.pool(PoolSpec(name="sparse-a", instance=InstanceSpec(cpus=1, memory_gb=2),
                                          min_instances=1, max_instances=1, warm_per_image=0))
        spec = SandboxSpec(image=busybox_image, cpus=0.5, memory_gb=0.25)
        async with first.sandbox(spec) as sb:
            made = await sb.exec(make, timeout_s=60)
            assert made.exit_code == 0, made
            before = await sb.exec(look)
            ref = await sb.snapshot()
        second = await fleet.pool(PoolSpec(name="sparse-b", mode="ephemeral",
                                           instance=InstanceSpec(cpus=1, memory_gb=2),
                                           min_instances=0, max_instances=1))
        async with second.sandbox(SandboxSpec(image=ref, cpus=0.5, memory_gb=0.25)) as fork:
            after = await fork.exec(look)
    assert before.exit_code == 0 and after.exit_code == 0, (before, after)
    size, blocks, unit, mtime, links = before.stdout.split("\n")[0].split()
    assert int(size) == gib + 4 and int(blocks) * int(unit) < 1 << 20, before.stdout
    assert after.stdout.split("\n")[1:] == before.stdout.split("\n")[1:]   # bytes, hard link, zeros
    assert before.stdout.split("\n")[1:4] == ["headmidtail", "1", "65536"], before.stdout
    f_size, f_blocks, f_unit, f_mtime, f_links = after.stdout.split("\n")[0].split()
    assert (f_size, f_mtime, f_links) == (size, mtime, links) == (str(gib + 4), mtime, "2")
    assert int(f_blocks) * int(f_unit) < 1 << 20, f"the fork holds {int(f_blocks) * int(f_unit)} bytes"


def test_sparse_label_round_trip_and_limits():
    from flowmesh_sdk.remote import sparse

    scan = (b"8 1073741824 work/a b\0" b"2048 1048576 dense\0" b"0 5242880 odd\nname\xff\0"
            b"0 9999999 ../escape\0" b"x 1 junk\0")
    found = sparse.sparse_paths(scan)
    assert sorted(p for _, p in found) == [b"odd\nname\xff", b"work/a b"]
    value = sparse.encode(found, [b"old/one", b"work/a b"])
    assert value.startswith("z1:") and " " not in value
    assert sparse.decode(value) == [b"work/a b", b"odd\nname\xff", b"old/one"]   # most hole first
    assert sparse.encode([]) == "" and sparse.decode("") == [] and sparse.decode("z1:!!") == []
    many = [(i, f"dir/{i:06d}-{'x' * 40}".encode()) for i in range(40000)]
    capped = sparse.encode(many)
    assert len(capped) <= sparse.LABEL_CAP and sparse.decode(capped)[0] == b"dir/039999-" + b"x" * 40


def test_digging_holes_stays_in_the_layer(tmp_path):
    """The dig follows no symbolic link out of a layer: a listed path through a link is
    left alone, the file the link leads to keeps its blocks; a listed file is made sparse
    with its bytes and mtime kept."""
    from flowmesh_sdk.remote import sparse

    layer, outside = tmp_path / "layer", tmp_path / "outside"
    layer.mkdir()
    outside.mkdir()
    for f in (layer / "big", outside / "victim"):
        f.write_bytes(b"data" + bytes(4 << 20))
        os.utime(f, ns=(1_000_000_000_123_456_789, 1_500_000_000_987_654_321))
    (layer / "link").symlink_to(outside)
    (layer / "victim").symlink_to(outside / "victim")
    res = subprocess.run(["sh", "-c", sparse.DIG, "sh", str(layer)], capture_output=True,
                         input=b"\0".join([b"big", b"link/victim", b"victim"]), timeout=60)
    assert res.returncode == 0, res.stderr
    big, victim = (layer / "big").stat(), (outside / "victim").stat()
    assert big.st_blocks * 512 < 1 << 20 and victim.st_blocks * 512 >= 4 << 20
    assert (layer / "big").read_bytes() == b"data" + bytes(4 << 20)
    assert big.st_mtime_ns == victim.st_mtime_ns == 1_500_000_000_987_654_321
