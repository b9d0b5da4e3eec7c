"""The content-addressable store: a real directory (with real processes racing and being
killed) and moto's S3 in server mode through real boto3."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flowmesh_sdk import SpecError
from flowmesh_sdk.cas import CasCorruptError, CasNotFoundError, LocalDirStore
from flowmesh_sdk.identity import digest_bytes

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- #
# behaviour both backends share
# --------------------------------------------------------------------------- #

async def _contract(store, corrupt_object, corrupt_ref) -> None:
    data = b"result bytes \x00\xff"
    digest = await store.put(data)
    assert digest == digest_bytes(data)
    assert await store.has(digest)
    assert await store.get(digest) == data
    assert await store.put(data) == digest                  # idempotent
    missing = digest_bytes(b"never stored")
    assert not await store.has(missing)
    with pytest.raises(CasNotFoundError):
        await store.get(missing)
    with pytest.raises(SpecError):
        await store.get("localhost/flowmesh/busybox:1")

    # a corrupted object is detected on read, never served, and a put repairs it
    corrupt_object(digest, b"result bytes \x00\xfe")
    with pytest.raises(CasCorruptError):
        await store.get(digest)
    assert await store.put(data) == digest
    assert await store.get(digest) == data

    # refs: create-if-absent, the second writer reads the first's bytes
    assert await store.read_ref("results/x") is None
    assert await store.create_ref("results/x", b"first") == (True, b"first")
    assert await store.create_ref("results/x", b"second") == (False, b"first")
    assert await store.read_ref("results/x") == b"first"
    await store.create_ref("results/y", b"y")
    await store.create_ref("other/z", b"z")
    assert await store.list_refs("results/") == ["results/x", "results/y"]

    # a corrupted ref is detected; dropping it lets it be created again
    corrupt_ref("results/x", b"garbage")
    with pytest.raises(CasCorruptError):
        await store.read_ref("results/x")
    with pytest.raises(CasCorruptError):
        await store.create_ref("results/x", b"third")
    assert await store.drop_ref("results/x")
    assert not await store.drop_ref("results/x")
    assert await store.create_ref("results/x", b"third") == (True, b"third")
    for bad in ("../escape", "Results/x", "a//b", "", "a/./b"):
        with pytest.raises(SpecError):
            await store.read_ref(bad)


async def test_local_store_contract(tmp_path: Path):
    store = LocalDirStore(tmp_path / "cas")

    def corrupt_object(digest: str, data: bytes) -> None:
        store.object_path(digest).write_bytes(data)

    def corrupt_ref(name: str, data: bytes) -> None:
        raw = bytearray(store.ref_path(name).read_bytes())
        raw[-1] ^= 0x01                      # one flipped bit in the body
        store.ref_path(name).write_bytes(bytes(raw))

    await _contract(store, corrupt_object, corrupt_ref)
    # a truncated ref is corrupt too
    store.ref_path("results/y").write_bytes(b"fmref1 abc")
    with pytest.raises(CasCorruptError):
        await store.read_ref("results/y")
    assert not list((tmp_path / "cas" / "tmp").iterdir())   # no temp file left by any write


# --------------------------------------------------------------------------- #
# real processes: racing publishers, and a writer killed half-way
# --------------------------------------------------------------------------- #

_RACER = textwrap.dedent("""
    import asyncio, json, sys
    from flowmesh_sdk.cas import LocalDirStore
    root, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = LocalDirStore(root)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    async def main():
        out = await asyncio.gather(*(store.create_ref(f"race/r{i}", f"{me}:{i}".encode())
                                     for i in range(n)))
        print(json.dumps([[created, body.decode()] for created, body in out]), flush=True)
    asyncio.run(main())
""")


def test_two_processes_publishing_the_same_refs_one_wins_the_other_reads_it(tmp_path: Path):
    root = tmp_path / "cas"
    LocalDirStore(root)
    n = 40
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, str(root), me, str(n)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for me in ("p1", "p2")]
    try:
        for p in procs:                       # both are up before either writes
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    winners = {"p1": 0, "p2": 0}
    for i in range(n):
        (c1, b1), (c2, b2) = results[0][i], results[1][i]
        assert c1 != c2, f"ref {i}: created by {'both' if c1 else 'neither'}"
        assert b1 == b2, f"ref {i}: the two processes disagree ({b1} vs {b2})"
        winners[b1.split(":")[0]] += 1
        assert (root / "refs" / "race" / f"r{i}").read_bytes().endswith(b1.encode())
    assert sum(winners.values()) == n


_KILLED_WRITER = textwrap.dedent("""
    import asyncio, os, sys, time
    from flowmesh_sdk.cas import LocalDirStore
    root, what = sys.argv[1], sys.argv[2]
    store = LocalDirStore(root)
    real_fsync = os.fsync
    def fsync_then_hang(fd):
        # FAULT INJECTION: the bytes are in the temp file; stop here, before the rename
        real_fsync(fd)
        print("written", flush=True)
        time.sleep(600)
    os.fsync = fsync_then_hang
    data = b"x" * 1_000_000
    if what == "object":
        asyncio.run(store.put(data))
    else:
        asyncio.run(store.create_ref("results/sha256/" + "c" * 64, data))
""")


@pytest.mark.parametrize("what", ["object", "ref"])
async def test_writer_killed_mid_write_leaves_nothing_visible(tmp_path: Path, what: str):
    root = tmp_path / "cas"
    store = LocalDirStore(root)
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(root), what], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert line.strip() == "written"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    digest = digest_bytes(b"x" * 1_000_000)
    assert not await store.has(digest)
    with pytest.raises(CasNotFoundError):
        await store.get(digest)
    assert await store.read_ref("results/sha256/" + "c" * 64) is None
    assert not list((root / "objects").rglob("*.*")) and not [p for p in (root / "refs").rglob("*") if p.is_file()]
    leftovers = list((root / "tmp").iterdir())
    assert len(leftovers) == 1 and leftovers[0].stat().st_size >= 1_000_000   # only the temp file
    assert await store.sweep_tmp(max_age_s=3600) == 0          # too young to be swept
    assert await store.sweep_tmp(max_age_s=0) == 1
    assert not list((root / "tmp").iterdir())
    # and the store works normally after the crash
    assert await store.put(b"x" * 1_000_000) == digest


# --------------------------------------------------------------------------- #
# S3 through boto3 against moto's server
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def moto_s3():
    from flowmesh_sdk.testing.moto_s3 import MotoS3

    with MotoS3() as moto:
        yield moto


async def test_s3_store_contract(moto_s3):
    store = moto_s3.store("cas-contract", prefix="fm")
    raw = moto_s3.s3_client()
    try:
        def corrupt_object(digest: str, data: bytes) -> None:
            raw.put_object(Bucket="cas-contract", Key=store.object_key(digest), Body=data)

        def corrupt_ref(name: str, data: bytes) -> None:
            body = raw.get_object(Bucket="cas-contract", Key=store.ref_key(name))["Body"].read()
            raw.put_object(Bucket="cas-contract", Key=store.ref_key(name), Body=body[:-1] + b"!")

        await _contract(store, corrupt_object, corrupt_ref)
        keys = sorted(o["Key"] for o in raw.list_objects_v2(Bucket="cas-contract")["Contents"])
        assert all(k.startswith("fm/objects/sha256/") or k.startswith("fm/refs/") for k in keys), keys
    finally:
        await store.close()


async def test_s3_create_ref_is_a_conditional_put(moto_s3):
    """The second writer's PUT carries If-None-Match: * and gets 412: the first object stays."""
    store = moto_s3.store("cas-conditional")
    raw = moto_s3.s3_client()
    try:
        assert (await store.create_ref("results/a", b"winner"))[0]
        # a plain conditional PUT by another client is refused by the server
        from botocore.exceptions import ClientError
        with pytest.raises(ClientError) as ei:
            raw.put_object(Bucket="cas-conditional", Key=store.ref_key("results/a"), Body=b"x",
                           IfNoneMatch="*")
        assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        # a ref someone else created first (raw PUT): the store reads theirs, keeps it
        raw.put_object(Bucket="cas-conditional", Key=store.ref_key("results/b"),
                       Body=(await _framed(b"theirs")))
        assert await store.create_ref("results/b", b"mine") == (False, b"theirs")
        assert await store.read_ref("results/b") == b"theirs"
    finally:
        await store.close()


async def _framed(body: bytes) -> bytes:
    from flowmesh_sdk.cas.base import frame_ref
    return frame_ref(body)


async def test_s3_errors_are_the_sdks(moto_s3):
    from flowmesh_sdk.cas import CasError

    store = moto_s3.store("no-such-bucket", create=False)
    try:
        with pytest.raises(CasError):
            await store.put(b"x")
    finally:
        await store.close()


def test_importing_the_cas_imports_no_cloud_sdk():
    code = ("import sys, flowmesh_sdk, flowmesh_sdk.cas, flowmesh_sdk.cas.s3, flowmesh_sdk.reuse, "
            "flowmesh_sdk.workflows; print('boto3' in sys.modules, 'botocore' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == ["False", "False"]
