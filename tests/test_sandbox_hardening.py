"""The exec and file path under hostile input, and the secure defaults, through the public
API (Fleet -> pool.sandbox -> exec / write_file / read_file) on real podman, each on a
busybox image (ash) and on the Debian image (dash as /bin/sh).  Issue 12."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from flowmesh_sdk import SandboxSpec, SpecError
from flowmesh_sdk.errors import SandboxFileError
from flowmesh_sdk.remote.runtime import SANDBOX_CAPABILITIES, RuntimeConfig
from flowmesh_sdk.sandbox import FILE_CAP, BinaryExecResult, ExecResult
from conftest import local_pool  # noqa: E402

DISK_LIMIT_MB = 32
GRACE_S = 15.0          # the host's own deadline past a command's timeout
# CAP_CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7
EXPECTED_CAPS = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7)


@pytest.fixture(scope="module")
async def pool(tmp_path_factory, busybox_image, swe_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-hardening"), "hard", warm_per_image=0,
                          runtime_config=RuntimeConfig(disk_limit_mb=DISK_LIMIT_MB)) as (_, p):
        yield p


@pytest.fixture(params=["busybox", "debian"])
def image(request, busybox_image, swe_image) -> str:
    return busybox_image if request.param == "busybox" else swe_image


def _spec(image: str, **kw) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=1, memory_gb=0.5, **kw)


async def test_dash_image_really_is_dash(pool, swe_image):
    async with pool.sandbox(_spec(swe_image)) as sb:
        r = await sb.exec("readlink -f /bin/sh")
        assert r.stdout.strip().endswith("dash"), r


# ---- 1. payloads of any size travel over the channel, never in argv --------------------

async def test_large_writes_and_commands_pass(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        for size in (200 << 10, 900 << 10, 1 << 20, 3 << 20):   # argv strings stop at 128 KiB
            text = (b"line of text ' \" $HOME `x` \\\n" * (size // 30 + 1))[:size]
            await sb.write_file(f"/tmp/w/{size}.txt", text)
            assert await sb.read_file(f"/tmp/w/{size}.txt") == text
        blob = bytes(range(256)) * 2000                          # NULs, every byte value
        await sb.write_file("/tmp/blob.bin", blob, mode=0o640)
        assert await sb.read_file("/tmp/blob.bin") == blob
        assert (await sb.exec("stat -c %a /tmp/blob.bin")).stdout.strip() == "640"
        await sb.write_file("/tmp/empty", b"")
        assert await sb.read_file("/tmp/empty") == b""

        word = "y" * (300 << 10)
        r = await sb.exec(f"printf %s '{word}' | wc -c")
        assert r.ok and r.stdout.strip() == str(len(word)), r.stderr[:300]
        heredoc = "\n".join(f"row {i}" for i in range(40000))  # ~350 KiB script
        r = await sb.exec(f"cat > /tmp/h.txt <<'EOF'\n{heredoc}\nEOF\nwc -l < /tmp/h.txt")
        assert r.ok and r.stdout.strip() == "40000", r.stderr[:300]
        # the sandbox is still in step after the big frames
        assert (await sb.exec("echo still in step")).stdout == "still in step\n"


async def test_write_file_over_the_cap_is_refused_before_sending(pool, busybox_image):
    async with pool.sandbox(_spec(busybox_image)) as sb:
        with pytest.raises(SpecError) as exc:
            await sb.write_file("/tmp/x", memoryview(bytearray(FILE_CAP + 1)))
        assert exc.value.field == "data"


# ---- 2. a timeout kills the whole tree, under dash, busybox ash and bash -----------------

_COUNT_SLEEPS = ("for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < $f 2>/dev/null; echo; done"
                 " | grep -c '^sleep 3[0-9]' || true")


_LIST_PROCS = ("for f in /proc/[0-9]*/stat; do { read -r l < $f; c=$(tr '\\000' ' ' < ${f%stat}cmdline);"
               " } 2>/dev/null && echo \"$l :: $c\"; done")


async def _assert_sleeps(sb, want: str, what: str) -> None:
    """The count of sleep processes once it stops changing: a process SIGKILLed as exec
    returned may still be listed for a while on a loaded machine, until the kernel has
    torn it down (polled for up to 10 s; one that is really alive, for 30 s or more, stays
    listed).  On a mismatch the sandbox's processes (stat line and argv) are shown."""
    for _ in range(40):
        got = (await sb.exec(_COUNT_SLEEPS)).stdout.strip()
        if got == want:
            return
        await asyncio.sleep(0.25)
    listing = (await sb.exec(_LIST_PROCS)).stdout
    pytest.fail(f"{what}: {got} sleep processes, expected {want}; processes:\n{listing}")


async def test_timeout_kills_the_process_tree(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        cmds = ["sleep 30 & sleep 31",                         # the documented example
                "(sleep 32 &) ; sleep 33 & sleep 34; echo never",  # orphaned grandchild
                "sh -c 'sleep 35 & sleep 36' & wait"]
        if "swe-base" in image:
            cmds.append("bash -c 'sleep 37 & sleep 38 & wait'")
        for cmd in cmds:
            r = await sb.exec(cmd, timeout_s=1)
            assert r.timed_out and not r.ok and "never" not in r.stdout, (cmd, r)
            assert r.duration_s < 1 + GRACE_S
            await _assert_sleeps(sb, "0", cmd)
        assert (await sb.exec("echo usable")).stdout == "usable\n"


async def test_background_job_from_an_earlier_exec_survives_a_later_timeout(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        assert (await sb.exec("sleep 39 >/dev/null 2>&1 &")).ok
        r = await sb.exec("sleep 30", timeout_s=1)
        assert r.timed_out
        await _assert_sleeps(sb, "1", "sleep 39 lives on, sleep 30 is gone")


# ---- 3. one command's output never reaches another's ------------------------------------

async def test_background_output_never_leaks_into_later_execs(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        r = await sb.exec("(while :; do echo LEAK; echo LEAKERR >&2; sleep 0.01; done) &")
        assert r.ok
        for i in range(8):
            r = await sb.exec(f"sleep 0.05; echo clean {i}", binary=True)
            assert r.stdout_raw == f"clean {i}\n".encode(), r.stdout_raw[:200]
            assert r.stderr_raw == b"", r.stderr_raw[:200]


# ---- 4. a command that deletes the agent's files returns normally ----------------------

async def test_deleting_the_agents_scratch_returns_normally(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        for cmd in ("find /tmp -mindepth 1 -maxdepth 1 -exec rm -rf {} +; echo gone",
                    "rm -rf /tmp/.[!.]* /tmp/*; echo gone",
                    "rm -rf /tmp; echo gone",
                    "(sleep 0.2; rm -rf /tmp/.[!.]*) & echo gone; sleep 0.5"):
            r = await sb.exec(cmd, timeout_s=20)
            assert r.ok and r.stdout == "gone\n" and not r.timed_out, (cmd, r)
            assert r.duration_s < 20
            assert (await sb.exec("echo next")).stdout == "next\n"
        await sb.exec("mkdir -p /tmp && chmod 1777 /tmp")
        await sb.write_file("/tmp/after.txt", b"x" * (200 << 10))
        assert len(await sb.read_file("/tmp/after.txt")) == 200 << 10


# ---- 5. bytes where bytes matter ---------------------------------------------------------

async def test_binary_output_as_exact_bytes(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        blob = bytes(range(256)) * 64 + b"\xff\xfe\x00"
        await sb.write_file("/tmp/b.bin", blob)
        r = await sb.exec("cat /tmp/b.bin; cat /tmp/b.bin >&2", binary=True)
        assert isinstance(r, BinaryExecResult) and isinstance(r, ExecResult)
        assert r.stdout_raw == blob and r.stderr_raw == blob
        assert r.stdout_bytes == len(blob) and isinstance(r.stdout, str) and "\ufffd" in r.stdout
        plain = await sb.exec("printf 'caf\\303\\251'")
        assert type(plain) is ExecResult and plain.stdout == "café"
        capped = await sb.exec("cat /tmp/b.bin", binary=True, output_cap=10)
        assert capped.stdout_raw == blob[:10] and capped.stdout_truncated


# ---- 6. bad paths are the caller's error, named by their field --------------------------

async def test_bad_paths_name_their_field(pool, busybox_image):
    async with pool.sandbox(_spec(busybox_image)) as sb:
        for bad, field in (("relative", "cwd"), ("tmp/x", "cwd"), ("/tmp\x00x", "cwd")):
            with pytest.raises(SpecError) as exc:
                await sb.exec("pwd", cwd=bad)
            assert exc.value.field == field, exc.value
        for call in (sb.read_file("/tmp/a\x00b"), sb.write_file("/tmp/a\x00b", b"x")):
            with pytest.raises(SpecError) as exc:
                await call
            assert exc.value.field == "path", exc.value
        with pytest.raises(SpecError) as exc:
            await sb.exec("echo a\x00b")
        assert exc.value.field == "command"
        assert (await sb.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    with pytest.raises(SpecError, match="workdir"):
        SandboxSpec(image=busybox_image, workdir="/wo\x00rk")


# ---- 7. secure defaults, probed from inside --------------------------------------------

def _status(text: str, key: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key + ":"))


async def test_capabilities_no_new_privs_and_user_namespace(pool, image):
    assert len(SANDBOX_CAPABILITIES) == 7
    async with pool.sandbox(_spec(image)) as sb:
        st = (await sb.exec("cat /proc/self/status")).stdout
        assert int(_status(st, "CapEff"), 16) == EXPECTED_CAPS
        assert int(_status(st, "CapBnd"), 16) == EXPECTED_CAPS      # cannot be regained
        assert _status(st, "NoNewPrivs") == "1"
        assert (await sb.exec("id -u")).stdout.strip() == "0"        # root inside ...
        uid_map = (await sb.exec("cat /proc/self/uid_map")).stdout.split()
        assert uid_map[:2] == ["0", "100000"] or uid_map[:2] != ["0", "0"], uid_map  # ... not on the host
        r = await sb.exec("mount -t tmpfs none /mnt 2>&1 || echo refused")
        assert "refused" in r.stdout
        # what a sandbox does need still works: chown, chmod, kill
        r = await sb.exec("touch /tmp/o && chown 1000:1000 /tmp/o && chmod 600 /tmp/o && "
                          "sleep 5 & kill $! && echo fine")
        assert r.stdout.strip().endswith("fine"), r


async def test_disk_limit_is_enforced(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        over = DISK_LIMIT_MB + 8
        r = await sb.exec(f"dd if=/dev/zero of=/root/big bs=1M count={over} 2>&1; echo rc=$?")
        assert "rc=0" not in r.stdout, r.stdout
        size = int((await sb.exec("wc -c < /root/big")).stdout.strip())
        assert size <= DISK_LIMIT_MB << 20
        with pytest.raises(SandboxFileError):
            await sb.write_file("/root/big2", b"\x00" * (over << 20))
        # a command's output is a file too: its stdout cannot pass the limit either
        r = await sb.exec(f"head -c {over << 20} /dev/zero", output_cap=1024)
        assert r.stdout_bytes <= DISK_LIMIT_MB << 20 and not r.ok
        await sb.exec("rm -f /root/big /root/big2")
        assert (await sb.exec("echo below the limit is fine")).ok


async def test_metadata_address_unreachable_with_network_on(pool, image):
    async with pool.sandbox(_spec(image, network=True)) as sb:
        routes = (await sb.exec("cat /proc/net/route")).stdout
        default = [line.split() for line in routes.splitlines()[1:] if line.split()[1] == "00000000"]
        assert default, routes                                  # the network is on ...
        gw = ".".join(str(b) for b in bytes.fromhex(default[0][2])[::-1])
        for addr in (gw, "169.254.169.254", "100.100.100.200"):
            if "swe-base" in image:
                probe = ("python3 -c \"import socket,sys\ntry:\n socket.create_connection(('%s', 80), 5)\n"
                         "except OSError as e: print('errno', e.errno)\nelse: print('connected')\"" % addr)
                r = await sb.exec(probe, timeout_s=10)
                unroutable = r.stdout.strip() == "errno 113"    # EHOSTUNREACH
            else:
                r = await sb.exec(f"nc -w 5 {addr} 80 </dev/null 2>&1; echo rc=$?", timeout_s=10)
                unroutable = "no route to host" in r.stdout.lower() and "rc=0" not in r.stdout
            if addr == gw:
                assert not unroutable, r                        # ... and routes elsewhere
            else:
                assert unroutable and r.duration_s < 5, r       # refused at once, not timed out
        if "busybox" in image:
            r = await sb.exec("ip route del unreachable 169.254.0.0/16 2>&1; echo rc=$?")
            assert "rc=0" not in r.stdout                       # no CAP_NET_ADMIN to undo it


async def test_many_sandboxes_come_and_go_with_the_user_namespace(pool, busybox_image):
    # podman's host-side /dev/shm of a user-namespaced container made `rm` fail (EBUSY)
    # while a later container lived; the runtime mounts its own tmpfs instead.
    async def one(i: int) -> str:
        async with pool.sandbox(_spec(busybox_image)) as sb:
            await sb.exec(f"echo {i} > /dev/shm/x")
            return (await sb.exec("cat /dev/shm/x")).stdout
    outs = await asyncio.gather(*(one(i) for i in range(6)))
    assert outs == [f"{i}\n" for i in range(6)]


async def test_output_reproducible_bytes_hash(pool, image):
    # the same bytes in, the same bytes out, over both framings (lines and dd)
    async with pool.sandbox(_spec(image)) as sb:
        short = await sb.exec("printf 'a\\tb\\\\c\\n  lead and trail  \\n'", binary=True)
        assert short.stdout_raw == b"a\tb\\c\n  lead and trail  \n"
        body = "x" * 5000
        long = await sb.exec(f"printf '%s' '{body}'  ", binary=True)
        assert hashlib.sha256(long.stdout_raw).hexdigest() == hashlib.sha256(body.encode()).hexdigest()


async def test_a_full_dev_shm_costs_no_command(pool, image):
    """Short scripts are stored on /dev/shm; when it is full they go to the scratch dir."""
    async with pool.sandbox(_spec(image)) as sb:
        sh = sb.session()
        await sh.run("cd /tmp && X=kept")
        fill = await sb.exec("i=0; while [ $i -lt 20 ] && dd if=/dev/zero of=/dev/shm/fill$i bs=1M count=16 "
                             "2>/dev/null; do i=$((i + 1)); done; df -k /dev/shm | tail -n 1")
        assert fill.stdout.split()[-2] == "100%", fill.stdout
        assert (await sb.exec("echo still")).stdout == "still\n"
        assert (await sh.run('echo "$PWD $X"')).stdout == "/tmp kept\n"
        proc = await sb.start("echo streamed")
        assert (await proc.wait()).stdout == "streamed\n"
        await sb.exec("rm -f /dev/shm/fill*")
