"""Shell sessions, streamed and background processes, through the public API (Fleet ->
pool.sandbox -> session / start / exec(on_stdout=)) on real podman, on the busybox image
(ash) and the Debian image (bash for sessions, dash as /bin/sh).  Issue 13."""

from __future__ import annotations

import asyncio
import os

import pytest

from flowmesh_sdk import SandboxSpec
from flowmesh_sdk.errors import SandboxClosedError
from flowmesh_sdk.sandbox import EXEC_CHANNELS, BinaryExecResult
from conftest import local_pool  # noqa: E402


@pytest.fixture(scope="module")
async def pool(tmp_path_factory, busybox_image, swe_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-sessions"), "sess", warm_per_image=0) as (_, p):
        yield p


@pytest.fixture(params=["busybox", "debian"])
def image(request, busybox_image, swe_image) -> str:
    return busybox_image if request.param == "busybox" else swe_image


def _spec(image: str, **kw) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=1, memory_gb=0.5, **kw)


async def test_state_persists_in_a_session_and_not_across_sessions(pool, image):
    async with pool.sandbox(_spec(image, env={"FROM_SPEC": "s"})) as sb:
        main = sb.session()
        assert main.shell == (None)                      # started on first use
        r = await main.run("mkdir -p /tmp/w && cd /tmp/w && X=local && export Y=exported && "
                           "greet() { echo \"hi $1\"; }")
        assert r.ok, r
        assert main.shell == ("/bin/sh" if "busybox" in image else "/usr/bin/bash")
        r = await main.run('pwd; echo "$X|$Y|$FROM_SPEC"; greet you; exit_code_next() { return 3; }')
        assert (r.stdout, r.stderr, r.exit_code) == ("/tmp/w\nlocal|exported|s\nhi you\n", "", 0)
        r = await main.run("exit_code_next")
        assert r.exit_code == 3 and not r.timed_out
        r = await main.run("echo out; echo err >&2; false")
        assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 1)
        assert sb.session("main") is main
        other = sb.session("other", cwd="/tmp", env={"Z": "z"})
        r = await other.run('pwd; echo "[$X|$Y|$Z]"; command -v greet || echo no-greet')
        assert r.stdout == "/tmp\n[||z]\nno-greet\n", r
        # exec stays a fresh shell
        assert (await sb.exec('echo "[$X$Y]"; pwd')).stdout == "[]\n/\n"
        # a venv-style activate script: PATH and a function persist
        await main.run("mkdir -p /tmp/venv/bin && printf '#!/bin/sh\\necho venv-tool\\n' > /tmp/venv/bin/vt && "
                       "chmod +x /tmp/venv/bin/vt && printf 'export VIRTUAL_ENV=/tmp/venv\\n"
                       "PATH=/tmp/venv/bin:$PATH; export PATH\\ndeactivate() { echo bye; }\\n' > /tmp/venv/bin/activate")
        assert (await main.run(". /tmp/venv/bin/activate")).ok
        r = await main.run("vt; echo $VIRTUAL_ENV; deactivate")
        assert r.stdout == "venv-tool\n/tmp/venv\nbye\n", r
        # a syntax error is that command's failure; the session goes on
        r = await main.run("echo 'unterminated")
        assert r.exit_code != 0 and r.stderr
        assert (await main.run("pwd")).stdout == "/tmp/w\n"
        r = await main.run("printf '\\000\\377'", binary=True)
        assert isinstance(r, BinaryExecResult) and r.stdout_raw == b"\x00\xff"
        assert main.restarts == 0


async def test_interrupt_sleep_and_busy_loop_then_the_session_goes_on(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        s = sb.session()
        await s.run("cd /tmp && KEEP=kept")
        lost = 0
        for cmd in ("sleep 100; echo not-reached", "while :; do :; done; echo not-reached"):
            task = asyncio.ensure_future(s.run(cmd))
            await _until_running(sb, "sleep 100" if "sleep" in cmd else None, s)
            await s.interrupt()
            r = await asyncio.wait_for(task, 30)
            assert r.exit_code != 0 and "not-reached" not in r.stdout and not r.timed_out, r
            if "do :; done" in cmd and _ash_lost_its_shell(s, r):
                lost += 1
                await s.run("cd /tmp && KEEP=kept")
                continue
            r = await s.run('pwd; echo "$KEEP"')
            assert r.stdout == "/tmp\nkept\n", r
        assert s.restarts == lost
        await s.interrupt()                                     # nothing running: a no-op


async def test_timeout_kills_the_commands_tree_and_keeps_the_session_and_its_jobs(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        s = sb.session()
        r = await s.run("sleep 300 & echo $! > /tmp/bg.pid; cd /tmp; V=1")
        assert r.ok, r
        r = await s.run("(sleep 200; echo leaked) & sleep 100", timeout_s=1)
        assert r.timed_out and not r.ok, r
        r = await s.run('pwd; echo $V; kill -0 "$(cat /tmp/bg.pid)" && echo bg-alive')
        assert r.stdout == "/tmp\n1\nbg-alive\n", r                # the earlier job survives
        ps = await _ps(sb)
        assert "sleep 200" not in ps and "sleep 100" not in ps, ps  # the timed-out tree is gone
        cmd = "while :; do :; done"                               # builtins only: the shell itself
        r = await s.run(cmd, timeout_s=1)
        assert r.timed_out, r
        lost = _ash_lost_its_shell(s, r)
        assert (await s.run("echo $V")).stdout == ("\n" if lost else "1\n")
        assert s.restarts == lost


async def test_a_timeout_whose_shell_answers_late_keeps_the_session(pool, swe_image, monkeypatch):
    # A shell thrown back to its prompt by the timeout's SIGINT may take longer than the
    # grace to answer: a busy machine (CI saw it: state lost after a builtin loop's
    # timeout), or a slow prompt (a git prompt in ~/.bashrc; here PROMPT_COMMAND sleeps
    # 0.3 s, and the grace is 1 ms).  Old code sent the shell a second SIGINT then, which
    # can land after the shell began to answer (the answer is aborted and the shell waits
    # at its prompt for good) -- or, on busybox ash, inside libc with a lock held (its
    # handler longjmps out; the shell hangs in futex_do_wait).  Either way the session
    # was restarted, its state lost.  The shell gets one SIGINT per command.
    from flowmesh_sdk.sandbox import session as session_mod
    monkeypatch.setattr(session_mod, "_INT_GRACE_S", 0.001)
    async with pool.sandbox(_spec(swe_image)) as sb:
        s = sb.session()
        await s.run("cd /tmp && export MODE=kept && PROMPT_COMMAND='sleep 0.3'")
        sent: list[tuple[int, object]] = []           # (command, the shell's signal)
        signal_tree = sb._signal_tree

        async def recording(pid, since, tree_sig, shell_sig):
            sent.append((s._running.ident if s._running else 0, shell_sig))
            await signal_tree(pid, since, tree_sig, shell_sig)
        monkeypatch.setattr(sb, "_signal_tree", recording)
        for cmd in ["while :; do :; done", "sleep 100; echo not-reached"] * 3:
            r = await s.run(cmd, timeout_s=0.5)
            assert r.timed_out and "not-reached" not in r.stdout, r
            r = await s.run('pwd; echo "$MODE"')
            assert r.stdout == "/tmp\nkept\n", r
        assert s.restarts == 0
        shell_ints = [ident for ident, shell_sig in sent if shell_sig]
        assert len(shell_ints) == len(set(shell_ints)) == 6, sent
        assert len(sent) > 6, sent                    # the later stages did come


async def test_background_server_started_with_start_and_reached_from_another_command(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        if "busybox" in image:
            await sb.write_file("/srv/index.html", "hello from httpd\n")
            server = await sb.start("exec httpd -f -p 127.0.0.1:8080 -h /srv")
            fetch = "wget -q -O - http://127.0.0.1:8080/index.html"
        else:
            await sb.write_file("/srv/index.html", "hello from python\n")
            server = await sb.start("cd /srv && exec python3 -u -m http.server 8080 --bind 127.0.0.1")
            fetch = ("python3 -c \"import urllib.request as u;"
                     "print(u.urlopen('http://127.0.0.1:8080/index.html').read().decode(), end='')\"")
        assert server.pid > 0 and server.returncode is None
        for _ in range(100):
            r = await sb.exec(fetch, timeout_s=10)
            if r.ok:
                break
            await asyncio.sleep(0.1)
        assert r.ok and r.stdout.startswith("hello from"), r
        s = sb.session()
        assert (await s.run(fetch)).stdout == r.stdout          # from a session too
        await server.kill()
        res = await server.wait(timeout_s=30)
        assert res.exit_code in (137, -9) or not res.ok
        assert not (await sb.exec(fetch, timeout_s=10)).ok     # gone


async def test_streaming_order_and_completeness_under_10_mb(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        expected = "".join(f"{i}\n" for i in range(1, 1_500_001)).encode()
        assert len(expected) > 10 << 20
        proc = await sb.start("seq 1 1500000; echo done >&2", output_cap=16 << 20)
        chunks = [c async for c in proc.stdout]
        assert b"".join(chunks) == expected and len(chunks) > 1
        assert await proc.stderr.read() == b"done\n"
        res = await proc.wait()
        assert res.ok and res.stdout_bytes == len(expected) and not res.stdout_truncated
        # exec(on_stdout=): the same bytes through a callback, capped like exec
        got: list[bytes] = []
        r = await sb.exec("seq 1 200000", on_stdout=got.append, output_cap=100_000)
        assert r.stdout_truncated and r.stdout_bytes == len("".join(f"{i}\n" for i in range(1, 200_001)))
        assert b"".join(got).startswith(expected[:100_000]) and b"output truncated" in got[-1]
        assert r.stdout.startswith(expected[:100_000].decode()) and "output truncated" in r.stdout


async def test_stdin_round_trip_and_framing_under_hostile_input(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        blob = os.urandom(300_000) + b"\n__fm_run 1 5 10 10 0 0\n__fm_end\n__fm_eof\n" + bytes(range(256))
        proc = await sb.start("cat; echo eof-seen >&2", binary=True)
        for i in range(0, len(blob), 70_000):
            await proc.write_stdin(blob[i:i + 70_000])
        await proc.close_stdin()
        res = await proc.wait(timeout_s=60)
        assert res.ok and res.stdout_raw == blob and res.stderr == "eof-seen\n"
        # a command that never reads its input: its stdin backs up, the sandbox does not
        deaf = await sb.start("sleep 100")
        await deaf.write_stdin(b"x" * 4096)
        await deaf.kill()
        assert not (await deaf.wait(timeout_s=30)).ok
        assert (await sb.exec("echo still fine")).stdout == "still fine\n"


async def test_two_commands_run_at_once_in_one_sandbox(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        # each waits for what the other does: they can only finish if they run together
        a = sb.exec("touch /tmp/a; while [ ! -e /tmp/b ]; do sleep 0.05; done; echo A", timeout_s=60)
        b = sb.exec("while [ ! -e /tmp/a ]; do sleep 0.05; done; touch /tmp/b; echo B", timeout_s=60)
        ra, rb = await asyncio.gather(a, b)
        assert (ra.stdout, rb.stdout) == ("A\n", "B\n")
        waiter = await sb.start("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo released")
        s = sb.session()
        assert (await s.run("touch /tmp/go && echo set")).stdout == "set\n"
        assert (await waiter.wait(timeout_s=60)).stdout == "released\n"
        # every exec channel busy: a session's timeout still gets its signal through
        held = [asyncio.ensure_future(sb.exec("while [ ! -e /tmp/go2 ]; do sleep 0.05; done; echo held",
                                              timeout_s=60)) for _ in range(EXEC_CHANNELS)]
        r = await s.run("sleep 100", timeout_s=1)
        assert r.timed_out, r
        await s.run("touch /tmp/go2")
        assert [x.stdout for x in await asyncio.gather(*held)] == ["held\n"] * EXEC_CHANNELS


async def test_closing_the_sandbox_kills_every_session_and_process(pool, image):
    async with pool.sandbox(_spec(image)) as sb:
        cid = sb.container_id
        procs = [await sb.start("sleep 1000") for _ in range(4)]
        s1, s2 = sb.session("a"), sb.session("b")
        await s2.run("sleep 1000 &")
        busy = asyncio.ensure_future(s1.run("sleep 1000"))
        await _until_running(sb, "sleep 1000", s1)
        await sb.close()
    for p in procs:
        with pytest.raises(SandboxClosedError):
            await p.wait(timeout_s=30)
    with pytest.raises(SandboxClosedError):
        await asyncio.wait_for(busy, 30)
    with pytest.raises(SandboxClosedError):
        await s2.run("true")
    with pytest.raises(SandboxClosedError):
        await sb.start("true")
    assert cid not in {c.id for c in await sb.runtime.list()}


@pytest.fixture(params=["busybox-ash", "debian-bash", "debian-dash"])
def shell_case(request, busybox_image, swe_image) -> tuple[str, str | None, str]:
    """(image, session shell, the shell it must be): every shell a session runs in."""
    return {"busybox-ash": (busybox_image, None, "/bin/sh"),
            "debian-bash": (swe_image, None, "/usr/bin/bash"),
            "debian-dash": (swe_image, "/bin/sh", "/bin/sh")}[request.param]


async def test_exit_in_a_session_answers_and_the_next_run_starts_a_fresh_shell(pool, shell_case):
    # issue 24 (8): old code: busybox and dash answered exit 0 and the next run raised
    # SandboxClosedError; bash raised SandboxClosedError for the `exit 3` itself
    image, shell, expect = shell_case
    async with pool.sandbox(_spec(image)) as sb:
        s = sb.session(shell=shell)
        start = (await s.run("pwd")).stdout
        assert s.shell == expect and start != "/tmp\n"
        r = await s.run("cd /tmp; X=set; sleep 300 & echo out; echo err >&2; exit 3")
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False), r
        assert s.restarts == 0
        r = await s.run('pwd; echo "[$X]"')
        assert (r.exit_code, r.stdout, r.stderr) == (0, start + "[]\n", ""), r     # a fresh shell
        assert s.restarts == 1
        assert "sleep 300" not in await _ps(sb)           # what the ended shell started went with it
        # `exit` alone gives the last status; errexit ends the shell the same way
        r = await s.run("cd /tmp; false; exit")
        assert (r.exit_code, r.stdout) == (1, ""), r
        r = await s.run("set -e; echo before; false; echo not-reached")
        assert (r.exit_code, r.stdout) == (1, "before\n"), r
        # a subshell's exit ends only the subshell
        r = await s.run("(exit 4); echo $?; v=$(exit 5); echo $?; pwd")
        assert (r.exit_code, r.stdout) == (0, "4\n5\n" + start), r
        assert s.restarts == 3 and not s.closed


def _ash_lost_its_shell(s, r) -> bool:
    """busybox ash, sent SIGINT while it runs builtins only, can hang for good now and
    then (its handler longjmps out of libc with a lock held: seen about once in 60-100
    such SIGINTs on a busy machine); the SDK then restarts it and says so in the result,
    as docs/api.md says.  Only there is a lost shell allowed; bash never loses one."""
    if "it was restarted" not in r.stderr:
        return False
    assert s.shell != "/bin/bash", r
    return True


async def _until_running(sb, needle: str | None, session) -> None:
    """Until the session's command has started (and ``needle`` shows in ps, if given)."""
    for _ in range(200):
        if session.running:
            if needle is None:
                return
            ps = await _ps(sb)
            if needle in ps:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{needle or 'the command'} did not start")


async def _ps(sb) -> str:
    """The command lines of the sandbox's processes (the Debian image has no ps)."""
    r = await sb.exec("for f in /proc/[0-9]*/cmdline; do tr '\\000' ' ' < \"$f\"; echo; done 2>/dev/null")
    return r.stdout
