"""The sandbox API on real podman containers (busybox image)."""

import asyncio
import os
import platform
import time
import uuid

import pytest

from flowmesh_sdk.errors import RuntimeMissingError, SandboxClosedError, SandboxFileError, SpecError
from flowmesh_sdk.remote.local import LocalRunner
from flowmesh_sdk.remote.runtime import ContainerRuntime, RuntimeConfig
from flowmesh_sdk.sandbox import Sandbox
from flowmesh_sdk.specs import SandboxSpec

LABEL = "flowmesh.test"


@pytest.fixture
async def make_sandbox(busybox_image):
    rt = ContainerRuntime(LocalRunner())
    made: list[Sandbox] = []

    async def make(**kw) -> Sandbox:
        spec = SandboxSpec(image=kw.pop("image", busybox_image), **kw)
        name = f"fm-test-{uuid.uuid4().hex[:8]}"
        cid = await rt.create(name, spec, {LABEL: "sandbox"})
        sb = Sandbox(rt, cid, name, spec)
        made.append(sb)
        return await sb.start()

    yield make
    for sb in made:
        await sb.close()
    assert not await rt.list({LABEL: "sandbox"})


async def test_exit_codes_and_separate_streams(make_sandbox):
    sb = await make_sandbox()
    r = await sb.exec("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, "out\n", "err\n", False)
    assert not r.ok
    r = await sb.exec("printf 'no newline'")
    assert r.stdout == "no newline" and r.exit_code == 0 and r.ok
    r = await sb.exec("kill -TERM $$")
    assert r.exit_code == 128 + 15


async def test_quoting_env_and_cwd(make_sandbox):
    sb = await make_sandbox(env={"FROM_SPEC": "spec value"})
    r = await sb.exec("""printf '%s|%s|%s' "$FROM_SPEC" "$X" 'it'"'"'s'""", env={"X": "a'b\"c $HOME"})
    assert r.stdout == "spec value|a'b\"c $HOME|it's"
    r = await sb.exec("mkdir -p /tmp/w && cd /tmp/w && pwd")
    assert r.stdout.strip() == "/tmp/w"
    assert (await sb.exec("pwd", cwd="/tmp")).stdout.strip() == "/tmp"
    r = await sb.exec("pwd", cwd="/does/not/exist")
    assert r.exit_code == 126 and "exist" in r.stderr
    with pytest.raises(SpecError, match="env"):
        await sb.exec("true", env={"BAD KEY": "v"})
    with pytest.raises(SpecError, match="timeout_s"):
        await sb.exec("true", timeout_s=-1)


async def test_timeout_kills_process_tree_and_sandbox_stays_usable(make_sandbox):
    sb = await make_sandbox()
    r = await sb.exec("(sleep 300 &) ; sleep 301 & sleep 302; echo never", timeout_s=1)
    assert r.timed_out and "never" not in r.stdout and not r.ok
    ps = await sb.exec("ps -o args | grep -c '^sleep 30[012]' || true")
    assert ps.stdout.strip() == "0", ps.stdout
    assert (await sb.exec("echo still here")).stdout == "still here\n"


async def test_output_cap_truncates_with_marker(make_sandbox):
    sb = await make_sandbox()
    r = await sb.exec("head -c 300000 /dev/zero | tr '\\0' a; echo tail >&2", output_cap=1000)
    assert r.stdout_truncated and r.stdout_bytes == 300000
    assert r.stdout.startswith("a" * 1000)
    assert "[flowmesh: output truncated: 300000 bytes written, first 1000 kept]" in r.stdout
    assert r.stderr == "tail\n" and not r.stderr_truncated


async def test_files_roundtrip_binary_and_text(make_sandbox, tmp_path):
    sb = await make_sandbox()
    text = "quotes ' \" $HOME `x` \\ and unicode ✓\n".encode()
    await sb.write_file("/tmp/a/b/text.txt", text)
    assert await sb.read_file("/tmp/a/b/text.txt") == text
    blob = bytes(range(256)) * 40  # NUL bytes travel over the channel like any other
    await sb.write_file("/tmp/blob.bin", blob, mode=0o600)
    assert await sb.read_file("/tmp/blob.bin") == blob
    assert (await sb.exec("stat -c %a /tmp/blob.bin")).stdout.strip() == "600"
    with pytest.raises(SandboxFileError, match="cannot read /nope"):
        await sb.read_file("/nope")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("X = 1\n")
    (src / "top.txt").write_text("top\n")
    await sb.upload(str(src), "/work")
    assert (await sb.exec("cat /work/pkg/m.py /work/top.txt")).stdout == "X = 1\ntop\n"
    await sb.exec("echo made-inside > /work/pkg/new.txt")
    await sb.download("/work/pkg", str(tmp_path / "out"))
    assert (tmp_path / "out" / "pkg" / "new.txt").read_text() == "made-inside\n"
    # what cannot be downloaded is a FlowMesh error that says why (tar's own complaint, not its last line)
    with pytest.raises(SandboxFileError, match="download of /nope failed: tar: nope: (Cannot stat: )?No such file"):
        await sb.download("/nope", str(tmp_path / "out"))
    (tmp_path / "top-file").write_text("")
    with pytest.raises(SpecError, match="local_dir: .* exists and is not a directory"):
        await sb.download("/work/pkg", str(tmp_path / "top-file"))   # was a FileExistsError
    # a hostile sandbox's link out of the destination is refused (tarfile's data filter), as a FlowMesh error
    await sb.exec("mkdir -p /work/evil && ln -sf /etc/passwd /work/evil/link")
    with pytest.raises(SandboxFileError, match="download of /work/evil into .* failed: .*absolute"):
        await sb.download("/work/evil", str(tmp_path / "evil"))
    assert not (tmp_path / "evil" / "evil" / "link").exists()


async def test_limits_hold_and_neighbours_unaffected(make_sandbox):
    bomb = await make_sandbox(pids=40, memory_gb=0.0625, cpus=0.5)
    calm = await make_sandbox()
    limits = await bomb.exec("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max"
                             " 2>/dev/null || cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max")
    assert limits.stdout.split() == [str(64 * 1024 * 1024), "40"]
    # the bomb runs in a subshell and the command's shell in a loop of builtins (a shell
    # that cannot fork ends: had it been the bomb's, the command would end early and its
    # bomb, in the background, would hold the limit): it times out, and the timeout kills
    # its whole tree
    r = await bomb.exec("(f(){ f|f & }; f) 2>/dev/null & while :; do :; done", timeout_s=3)
    assert r.timed_out, r
    # allocating 200 MB in a 64 MB sandbox gets the allocator OOM-killed (137)
    r = await bomb.exec("dd if=/dev/zero of=/dev/null bs=200M count=1", timeout_s=30)
    assert r.exit_code == 137, r
    assert (await bomb.exec("echo alive")).stdout == "alive\n"
    assert (await calm.exec("echo calm")).stdout == "calm\n"


async def test_a_full_process_limit_leaves_the_agent_its_own_slots(make_sandbox):
    # An earlier exec's background job fills the process limit and holds it (sleeps).
    # Old code: busybox ash, the agent, could not fork to answer the next exec and ended
    # ("can't fork"); new agents could not start either (runc exec failed): the sandbox
    # was lost (the first exec after it, when the table was exactly full; not every run
    # here gets it so full).  Now what an exec runs may take pids - 8 processes; the
    # agent keeps 8.
    # (Not a session's commands: the session's shell forks to answer, docs/security.md.)
    sb = await make_sandbox(pids=40)
    r = await sb.exec("(while :; do sleep 100 & done) >/dev/null 2>&1 & echo started")
    assert r.stdout == "started\n", r
    count = 'n=0; for p in /proc/[0-9]*; do n=$((n + 1)); done; echo "$n"'
    seen: list[int] = []
    deadline = time.monotonic() + 90          # a bound on the wait, not a timing claim (a loaded CI host is slow)
    # until the filler has hit the limit: one read near it.  The count then keeps moving by a
    # few (28-33 seen) while the filler lives on, taking each slot an exec's shell frees, so
    # waiting for it to stand still, or for two high reads in a row (CI: 31, 28, 32, 28, 29,
    # 28, ... for 90 s), is a wait that may never end.
    while time.monotonic() < deadline:
        seen.append(int((await sb.exec(count)).stdout))
        if seen[-1] >= 30:
            break
        await asyncio.sleep(0.25)
    assert 30 <= seen[-1] <= 40, seen          # (the count's own shell is one of them)
    for _ in range(3):
        assert (await sb.exec("echo alive")).stdout == "alive\n"
    assert (await sb.exec("ulimit -u")).stdout == "32\n"


async def test_network_off_by_default(make_sandbox):
    off = await make_sandbox()
    devs = (await off.exec("cat /proc/net/dev")).stdout
    ifaces = {line.split(":")[0].strip() for line in devs.splitlines()[2:]}
    assert ifaces == {"lo"}


async def test_closed_sandbox_refuses(make_sandbox):
    sb = await make_sandbox()
    await sb.close()
    with pytest.raises(SandboxClosedError):
        await sb.exec("true")


async def test_concurrent_execs_are_serialised(make_sandbox):
    sb = await make_sandbox()
    results = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(20)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]


_STAT = 'read -r _p _c _s ppid pgrp sid _r < /proc/$$/stat; '


async def test_each_exec_is_a_fresh_shell_leading_its_own_session(make_sandbox):
    """The shell an exec runs in is made ahead (the agent's standby), and is still a fresh
    /bin/sh: no variable of the agent's or of the last command, no arguments, its own
    session and process group, a child of the agent."""
    sb = await make_sandbox()
    first = await sb.exec(_STAT + 'x=1; echo "$$ $ppid $pgrp $sid $#"; set | grep -c "^__fm" || true')
    pid, ppid, pgrp, sid, argc = first.stdout.split("\n")[0].split()
    assert pgrp == sid == pid and argc == "0" and first.stdout.split("\n")[1] == "0", first.stdout
    second = await sb.exec(_STAT + 'echo "${x-unset} $$ $ppid $pgrp $sid"')
    x, pid2, ppid2, pgrp2, sid2 = second.stdout.split()
    assert x == "unset" and pid2 != pid and ppid2 == ppid and pgrp2 == sid2 == pid2, second.stdout


async def test_a_streamed_process_leaves_the_agent_a_standby(make_sandbox):
    """A started process forks on the agent's channel; the agent makes a fresh standby after
    it, so the exec that follows still runs in a shell made ahead ($0 "sh")."""
    sb = await make_sandbox()
    for i in range(2):
        proc = await sb.start(f"echo p{i}")
        assert (await proc.wait()).stdout == f"p{i}\n"
        after = await sb.exec('echo "$0"; sleep 0.2 & wait')
        assert (after.exit_code, after.stdout) == (0, "sh\n"), after


async def test_a_killed_standby_costs_nothing_but_its_own_start(make_sandbox):
    """A background job that kills the shell the agent made ahead for the next command: that
    command is started afresh, and the next one has a standby again."""
    sb = await make_sandbox()
    # the agent's child whose program is the standby's (not this job: a fork of this command's shell)
    kill = ('a=$PPID; ( sleep 0.5; for d in /proc/[0-9]*; do read -r _p _c _s pp _r < "$d/stat" 2>/dev/null '
            '&& [ "$pp" = "$a" ] && grep -q __fm_p "$d/cmdline" 2>/dev/null && kill -9 "${d#/proc/}"; done '
            ') >/dev/null 2>&1 &')
    assert (await sb.exec(kill)).exit_code == 0
    await asyncio.sleep(1.5)
    after = [await sb.exec(f'echo {i} "$0"; exit {i}') for i in range(3)]
    assert [r.exit_code for r in after] == [0, 1, 2]
    got = [r.stdout.split() for r in after]
    assert [g[0] for g in got] == ["0", "1", "2"], got
    # $0: the script's path when the shell was started for the command, "sh" for a standby
    assert got[0][1] != "sh" and [g[1] for g in got[1:]] == ["sh", "sh"], got


async def _agent_made(sb, name: str) -> None:
    """Until the agent's background job has made (and checked) its program ``name``."""
    deadline = time.monotonic() + 60        # a bound on the wait, not a timing claim
    while (await sb.exec(f'[ -x "/tmp/.flowmesh-$PPID/{name}" ]')).exit_code != 0:
        assert time.monotonic() < deadline, f"the agent's {name} was never made"
        await asyncio.sleep(0.1)


_LEADS = 'read -r p c t pp g s r </proc/$$/stat; [ "$g $s" = "$$ $$" ] && echo leads'
_SWAP_LAUNCHER = """d=/tmp/.flowmesh-$PPID
cat > "$d/ss.x" <<'X'
#!/bin/sh
echo used >> /tmp/uses
exec setsid "$@"
X
chmod 700 "$d/ss.x" && mv -f "$d/ss.x" "$d/ss"
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the agent's launcher is x86-64 code")
async def test_commands_lead_their_sessions_through_the_agents_launcher_or_else_setsid(make_sandbox):
    """On x86-64 the agent writes a session launcher of its own (_setsid.py) into its
    directory, checks it in the background, and from then on makes each command's shell
    through it rather than through setsid.  A command that puts another program in its
    place, or removes it, changes only how its own sandbox's next shells are made."""
    sb = await make_sandbox()
    await _agent_made(sb, "ss")
    r = await sb.exec("sleep 30 & sleep 31; echo never", timeout_s=0.5)
    assert r.timed_out and "never" not in r.stdout, r
    assert (await sb.exec("pgrep -x sleep || echo none")).stdout == "none\n"   # the whole tree
    assert (await sb.exec(_SWAP_LAUNCHER)).exit_code == 0
    # each shell made after it (once the answer is sent) comes through it: five by the sixth
    assert [(await sb.exec(_LEADS)).stdout for _ in range(4)] == ["leads\n"] * 4
    assert (await sb.exec('rm "/tmp/.flowmesh-$PPID/ss"; wc -l < /tmp/uses')).stdout.strip() == "5"
    assert [(await sb.exec(_LEADS)).stdout for _ in range(3)] == ["leads\n"] * 3   # through setsid
    assert (await sb.exec("wc -l < /tmp/uses")).stdout.strip() == "5"


_SWAP_FRAMER = """for d in /tmp/.flowmesh-[0-9]*; do
  mv "$d/fr" "$d/fr.real"
  cat > "$d/fr.x" <<'X'
#!/bin/sh
echo "used $#" >> /tmp/answers
exec "$0.real" "$@"
X
  chmod 700 "$d/fr.x" && mv -f "$d/fr.x" "$d/fr"
done
"""
_MIXED = "printf 'out\\0put'; printf err >&2; head -c 100000 /dev/zero | tr '\\0' x; exit 3"


async def test_commands_with_output_are_answered_through_the_agents_framer_or_else_wc_and_dd(make_sandbox):
    """On x86-64 the agent writes an answer framer of its own (_framer.py) and checks it in
    the background; from then on a command with output is answered through it, one without
    output as before (printf alone), a started process is streamed through it, and where
    it is gone by wc and dd (and sleep between looks): the same answers and streams."""
    sb = await make_sandbox()
    await _agent_made(sb, "fr")

    async def answers() -> list[tuple[int, bytes, bytes, int, bool]]:
        out = []
        for cmd, cap in ((_MIXED, 1 << 20), (_MIXED, 1000), ("true", 1000), ("echo fine", 1000)):
            r = await sb.exec(cmd, binary=True, output_cap=cap)
            out.append((r.exit_code, r.stdout_raw, r.stderr_raw, r.stdout_bytes, r.stdout_truncated))
        chunks: list[bytes] = []                                     # streamed, cut at the cap
        r = await sb.exec(_MIXED, binary=True, output_cap=1000, on_stdout=chunks.append)
        out.append((r.exit_code, b"".join(chunks)[:1000], r.stderr_raw, r.stdout_bytes, r.stdout_truncated))
        proc = await sb.start("echo ready; read -r x; echo \"$x\" >&2; cat", binary=True)
        chunks, stream = [], proc.stdout.__aiter__()
        while b"".join(chunks) != b"ready\n":                          # streamed while it waits for input
            chunks.append(await asyncio.wait_for(stream.__anext__(), 60))
        await proc.write_stdin(b"line\nrest")
        await proc.close_stdin()
        r = await proc.wait(60)
        out.append((r.exit_code, r.stdout_raw, r.stderr_raw, r.stdout_bytes, r.stdout_truncated))
        return out

    want = [(3, b"out\0put" + b"x" * 100_000, b"err", 100_007, False),
            (3, (b"out\0put" + b"x" * 100_000)[:1000], b"err", 100_007, True),
            (0, b"", b"", 0, False), (0, b"fine\n", b"", 5, False),
            (3, (b"out\0put" + b"x" * 100_000)[:1000], b"err", 100_007, True),
            (0, b"ready\nrest", b"line\n", 10, False)]
    assert await answers() == want
    # the agents' framers (the exec channel's, and the process channel's), each behind a logger
    agents = await sb.exec("ls -d /tmp/.flowmesh-[0-9]*")
    assert len(agents.stdout.split()) == 2, agents
    assert (await sb.exec(_SWAP_FRAMER)).exit_code == 0
    assert await answers() == want
    # 3 answers (the commands with output: fr HEAD CAP) and 2 streams (fr ID CAP PID) went through them
    assert (await sb.exec('rm /tmp/.flowmesh-[0-9]*/fr; sort /tmp/answers | uniq -c', binary=True)
            ).stdout_raw.split() == [b"3", b"used", b"2", b"2", b"used", b"3"]
    assert await answers() == want                                   # by wc and dd (and sleep)
    assert (await sb.exec("wc -l < /tmp/answers; ls -d /tmp/.flowmesh-[0-9]*")).stdout == "5\n" + agents.stdout


# the processes a command's timeout forks: a watcher of the command's own sleeps its timeout
# (forked as the command starts: looked for a moment later)
_TIMERS = ("sleep 0.5; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null "
           "| grep -c '^sleep 123.000 $' || true")
_KILL_WATCHER = ('for d in /proc/[0-9]*; do grep -q __fm_mark "$d/cmdline" 2>/dev/null '
                 '&& kill -9 "${d#/proc/}" && echo killed; done')


async def test_the_agents_watcher_times_commands_and_comes_back_when_killed(make_sandbox, swe_image,
                                                                            busybox_image):
    """With bash in the image, one watcher per agent times every command (bash's ``read -t``):
    a command's timeout forks nothing.  Without bash, each command has a watcher of its own.
    A command that kills the agent's watcher leaves the next ones timed: the one after it by
    a watcher of its own, the later ones by the agent's watcher, started again."""
    for image, timers in ((swe_image, "0"), (busybox_image, "1")):
        sb = await make_sandbox(image=image)
        assert (await sb.exec(_TIMERS, timeout_s=123)).stdout.strip() == timers, image
        r = await sb.exec("sleep 30 & sleep 31; echo never", timeout_s=0.5)
        assert r.timed_out and r.exit_code == 137 and "never" not in r.stdout, (image, r)
        assert not (await sb.exec("exit 137", timeout_s=5)).timed_out   # SIGKILL's status alone
    sb = await make_sandbox(image=swe_image)
    assert "killed" in (await sb.exec(_KILL_WATCHER)).stdout
    for _ in range(2):
        # killed at its timeout in the sandbox: the host giving up on the agent (15 s later)
        # would raise SandboxTimeout instead of returning a result
        r = await sb.exec("sleep 30; echo never", timeout_s=0.5)
        assert r.timed_out and "never" not in r.stdout, r
        assert (await sb.exec(_TIMERS, timeout_s=123)).stdout.strip() == "0"
    assert (await sb.exec("echo still here", timeout_s=5)).stdout == "still here\n"


# how many of the test's `sleep 30` and `sleep 31` the sandbox runs (from /proc: an image may
# have no pgrep; a command's own timeout watcher may run a sleep too)
_SLEEPS = ("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < \"$f\"; echo; done 2>/dev/null "
           "| grep -c '^sleep 3[01] $' || true")


async def test_a_streamed_command_is_killed_at_its_timeout_with_its_tree(make_sandbox, swe_image, busybox_image):
    """A started process and ``exec(on_stdout=...)`` run in the shell made ahead (the
    standby) and are timed like an exec: by the agent's watcher with bash in the image, else
    by a watcher of their own.  At the deadline the whole tree is killed, what it wrote
    before is streamed, and the next commands are timed as before."""
    for image in (swe_image, busybox_image):
        sb = await make_sandbox(image=image)
        for _ in range(3):
            proc = await sb.start("echo first; sleep 30 & sleep 31; echo never", timeout_s=0.3)
            r = await proc.wait(60)
            assert r.timed_out and r.exit_code == 137 and r.stdout == "first\n", (image, r)
        got: list[bytes] = []
        r = await sb.exec("echo first; sleep 30 & sleep 31; echo never", timeout_s=0.3, on_stdout=got.append)
        assert r.timed_out and r.exit_code == 137 and b"".join(got) == b"first\n", (image, r)
        assert int((await sb.exec(_SLEEPS)).stdout) == 0, image
        for _ in range(3):    # ended before their timeouts: nothing of theirs is killed after
            r = await sb.exec("sleep 30 >/dev/null 2>&1 & echo $!", timeout_s=0.5, on_stdout=got.append)
            assert not r.timed_out and r.exit_code == 0, (image, r)
        await asyncio.sleep(1)
        assert int((await sb.exec(_SLEEPS)).stdout) == 3, image


async def test_a_sandbox_that_runs_a_few_commands_makes_a_few_output_files(make_sandbox, swe_image):
    """The agent's stocks of output files grow (2, 4, 8, ... pairs): a sandbox that runs a
    handful of commands makes about as many files as it uses, not two stocks of 32 pairs
    (each file costs the sandbox's CPU on the overlay)."""
    sb = await make_sandbox(image=swe_image)
    for i in range(3):
        assert (await sb.exec(f"echo {i}")).stdout == f"{i}\n"
    await asyncio.sleep(1)   # the stocks are made in the background
    made = await sb.exec("ls /tmp/.flowmesh-*/*/ | grep -c '[.][oe]$' || true")
    assert 0 < int(made.stdout) <= 2 * (2 + 4 + 8), made.stdout


async def test_a_job_left_reading_a_started_processs_input_never_gets_a_later_ones(make_sandbox, swe_image):
    """A started process's standard input is a fifo the agent made ahead, one per output
    pair of its stocks.  A job left reading one keeps that stock from being used again (a
    stock some process holds a file of is replaced, not emptied): no later process's input
    ever reaches it, through stocks made and reused (2, 4, 8, 16, then 32 pairs each)."""
    sb = await make_sandbox(image=swe_image)

    async def run(cmd: str, data: str) -> tuple[str, str]:
        proc = await sb.start("readlink /proc/$$/fd/0; " + cmd)
        await proc.write_stdin(data)
        await proc.close_stdin()
        r = await proc.wait(60)
        assert r.exit_code == 0, r
        stdin, _, out = r.stdout.partition("\n")
        return stdin, out

    stdins = [(await run("cat", f"input {i}\n"))[0] for i in range(8)]
    # a job that reads again after each end of input: were a later process's input written
    # to its fifo, it would read it
    stdin, job = await run("exec 3<&0; (while :; do cat <&3; sleep 0.05; done >> /tmp/stolen) & echo $!", "mine\n")
    assert stdin.endswith(".f"), stdin                               # a stock's fifo
    stdins.append(stdin)
    for i in range(100):
        stdin, out = await run("cat", f"input {i}\n")
        assert out == f"input {i}\n"
        stdins.append(stdin)
    assert (await sb.exec(f"kill -0 {job.strip()} && cat /tmp/stolen")).stdout == "mine\n"   # alive, its own only
    assert len(set(stdins)) == len(stdins)                           # a fifo of its own each
    assert sum(name.endswith(".f") for name in stdins) >= 100, stdins   # from the stocks, bar the first few


async def test_a_command_that_removes_the_agents_files_leaves_timeouts_exact(make_sandbox, swe_image):
    """The agent's watcher is told through a fifo in the agent's directory.  A command that
    removes that directory leaves later commands timed, and a command that ended before
    its timeout keeps its background jobs: no watcher kills them afterwards."""
    sb = await make_sandbox(image=swe_image)
    job = await sb.exec("sleep 30 >/dev/null 2>&1 & rm -rf /dev/shm/.flowmesh-* /tmp/.flowmesh-*; echo $!",
                        timeout_s=1)
    await asyncio.sleep(2)   # past that command's timeout
    assert (await sb.exec(f"kill -0 {job.stdout.strip()} && echo alive")).stdout == "alive\n"
    for _ in range(2):
        r = await sb.exec("sleep 30; echo never", timeout_s=0.5)
        assert r.timed_out and "never" not in r.stdout, r
    assert (await sb.exec(_TIMERS, timeout_s=123)).stdout.strip() == "0"   # the watcher is back


# the inode of the command's stdout file, kept by a link of its own: a later file can share
# that number only by being that same file (filesystems hand out a freed inode's number again)
_INODE = 'mkdir -p /tmp/keep && ln "$(readlink /proc/$$/fd/1)" /tmp/keep/$$ && stat -Lc %i /proc/$$/fd/1'


async def test_output_files_are_used_again_only_once_nothing_holds_them(make_sandbox, swe_image,
                                                                          busybox_image):
    """The agent empties a used stock of output files and hands it out again when no process
    holds any of them (making files on a container's overlay costs far more); a file that a
    background job of an earlier command still holds is no later command's, and what the job
    writes reaches no later command."""
    for image in (swe_image, busybox_image):
        sb = await make_sandbox(image=image)
        seen = [int((await sb.exec(_INODE)).stdout) for _ in range(120)]
        assert len(set(seen)) < len(seen), image   # files used again
        flag = f"/tmp/go-{uuid.uuid4().hex[:6]}"
        held = await sb.exec(f"(while [ ! -e {flag} ]; do sleep 0.05; done; echo LATE; echo LATE >&2) & "
                             + _INODE)
        later = []
        for i in range(150):   # several stocks' worth
            r = await sb.exec(_INODE + f"; echo {i} >&2")
            assert r.stderr == f"{i}\n", (image, r)
            later.append(int(r.stdout))
        assert int(held.stdout) not in later and len(set(later)) < len(later), image
        await sb.exec(f"touch {flag}; sleep 0.3")
        for i in range(100):
            r = await sb.exec(f"echo {i}; echo {i} >&2")
            assert (r.stdout, r.stderr) == (f"{i}\n", f"{i}\n"), (image, r)


async def test_missing_runtime_says_how_to_install():
    rt = ContainerRuntime(LocalRunner(), RuntimeConfig(binary="no-such-podman"))
    with pytest.raises(RuntimeMissingError, match="apt-get install -y podman"):
        await rt.probe()


async def test_a_runtime_whose_version_fails_is_named_with_what_it_said(tmp_path):
    fake = tmp_path / "podman"
    fake.write_text("#!/bin/sh\necho 'cannot connect to the runtime socket' >&2\nexit 125\n")
    fake.chmod(0o755)
    rt = ContainerRuntime(LocalRunner(), RuntimeConfig(binary=str(fake)))
    with pytest.raises(RuntimeMissingError, match=r"`podman` does not work on local \(`podman version` failed: "
                                                  r"cannot connect to the runtime socket\)"):
        await rt.probe()


async def test_the_runtime_probe_is_one_round_trip(recording_runner):
    """Binary, version and host facts (and the storage driver, for a disk limit) in one
    command: each is a round trip over SSH on a fresh machine's bootstrap."""
    info = await ContainerRuntime(recording_runner, RuntimeConfig(disk_limit_mb=100)).probe()
    calls = recording_runner.calls
    assert len(calls) == 1 and calls[0][:2] == ["sh", "-c"]
    assert info.binary == "podman" and info.version[:1].isdigit()
    assert f"fsize={100 << 20}" in " ".join(info.sandbox_flags)


async def test_runtime_flags_detected():
    info = await ContainerRuntime(LocalRunner()).probe()
    caps = int(next(l for l in open("/proc/self/status") if l.startswith("CapEff")).split()[1], 16)
    has_ulimit = "--ulimit" in info.run_flags
    assert has_ulimit == (not caps >> 24 & 1)
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers") and info.binary == "podman":
        assert info.run_flags[:2] == ("--runtime", "runc")
