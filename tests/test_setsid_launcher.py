"""The agent's static programs, run on this host: the session launcher
(flowmesh_sdk/sandbox/_setsid.py, 230 bytes) and the answer framer (_framer.py) it writes
into an x86-64 sandbox, their printf form in the shells an agent may run under, the
agent's checks that keep them only where they work, and the agent itself using them
(the protocol written by hand, so a command's id is the test's to choose)."""

import os
import platform
import shutil
import signal
import subprocess

import pytest

from flowmesh_sdk.sandbox._agent import _COMMON, AGENT
from flowmesh_sdk.sandbox._common import _frame_head
from flowmesh_sdk.sandbox._framer import _CODE as FRAMER_CODE, FRAMER, FRAMER_SOURCE, FRAMER_X86_64
from flowmesh_sdk.sandbox._setsid import LAUNCHER, SETSID_X86_64, printf_format

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="the launcher is x86-64 code")

_STAT = 'read -r p c t pp g s r </proc/$$/stat; echo "$$ $pp $g $s $# $1 ${X-unset}"'


@pytest.fixture
def launcher(tmp_path) -> str:
    path = tmp_path / "ss"
    path.write_bytes(SETSID_X86_64)
    path.chmod(0o700)
    return str(path)


def test_it_runs_the_program_with_its_arguments_and_environment_leading_a_session(launcher):
    r = subprocess.run([launcher, "/bin/sh", "-c", _STAT + "; exit 5", "sh", "one"], env={"X": "x y"},
                       capture_output=True, text=True, timeout=30)
    pid, ppid, pgrp, sid, argc, first, x = r.stdout.split(" ", 6)
    assert r.returncode == 5 and pid == pgrp == sid, r
    assert ppid == str(os.getpid()) and (argc, first, x) == ("1", "one", "x y\n")   # no fork: the same process


def test_it_fails_without_running_anything_when_it_cannot_start_a_session_or_the_program(launcher, tmp_path):
    mark = tmp_path / "ran"
    # a group leader cannot call setsid(): 126, and the program never runs
    r = subprocess.run([launcher, "/bin/sh", "-c", f"touch {mark}"], process_group=0, timeout=30)
    assert r.returncode == 126 and not mark.exists()
    assert subprocess.run([launcher, str(tmp_path / "missing")], timeout=30).returncode == 127
    assert subprocess.run([launcher], timeout=30).returncode == 127   # no program named


@pytest.mark.parametrize("shell", ["dash", "busybox sh", "bash"])
def test_its_printf_form_prints_every_byte(shell):
    argv = shell.split()
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed")
    data = bytes(range(256)) + SETSID_X86_64 + FRAMER_X86_64
    out = subprocess.run([*argv, "-c", 'printf "$1"', "sh", printf_format(data)], capture_output=True,
                         timeout=30).stdout
    assert out == data


def _prep(dirpath: str, *, env: dict[str, str] | None = None, wrap: tuple[str, ...] = ()) -> set[str]:
    """Run the agent's __fm_ssprep (dash) for the agent directory ``dirpath``: what is in it after."""
    script = _COMMON + LAUNCHER + f'__fm_ss=setsid; __fm_d={dirpath}; __fm_ssprep; ls -a "$__fm_d"\n'
    out = subprocess.run([*wrap, "dash", "-c", script], capture_output=True, text=True, timeout=30,
                         env=env or {"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out
    return set(out.stdout.split()) - {".", ".."}


def test_the_agent_keeps_the_launcher_only_once_a_shell_it_started_led_its_own_session(tmp_path):
    made = tmp_path / "agent"
    made.mkdir()
    assert _prep(str(made)) == {"ss"} and (made / "ss").read_bytes() == SETSID_X86_64
    # a step that fails leaves nothing behind (and setsid in use): no chmod on the PATH ...
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("mv", "rm", "ls", "dash"):
        (bare / tool).symlink_to(shutil.which(tool))
    (tmp_path / "a2").mkdir()
    assert _prep(str(tmp_path / "a2"), env={"PATH": str(bare)}) == set()
    # ... or a directory where nothing may be executed (a noexec tmpfs in a mount namespace
    # of its own: where this host allows one)
    noexec = tmp_path / "noexec"
    noexec.mkdir()
    wrap = ("unshare", "-m", "sh", "-c", f"mount -t tmpfs -o noexec none {noexec} && exec \"$@\"", "sh")
    if shutil.which("unshare") is None or subprocess.run([*wrap, "true"], capture_output=True,
                                                         timeout=30).returncode != 0:
        pytest.skip("no mount namespace with a noexec tmpfs here (needs root and unshare)")
    assert _prep(str(noexec), wrap=wrap) == set()


# ---- the answer framer --------------------------------------------------------------------

def _install_framer(path):
    path.write_bytes(FRAMER_X86_64)
    path.chmod(0o700)
    return path


def _answer(agent_dir: str, out: bytes, err: bytes, cap: int, skip: int = 0) -> bytes:
    """What the agent's __fm_answer (dash) sends for a command whose stdout and stderr files
    hold ``out`` and ``err`` (fd 5 read from offset ``skip``: a file shorter than its size)."""
    for name, data in (("o", out), ("e", err)):
        with open(f"{agent_dir}/{name}", "wb") as f:
            f.write(data)
    script = (_COMMON + FRAMER + f'__fm_d={agent_dir}; __cap={cap}; exec 7>&1\n'
              f'exec 5<"$__fm_d/o" 6<"$__fm_d/e"; [ {skip} = 0 ] || command dd bs={skip or 1} count=1 '
              '<&5 >/dev/null 2>&1\n__fm_answer "__FM__ 7 0 0"\n')
    r = subprocess.run(["dash", "-c", script], capture_output=True, timeout=60)
    assert r.returncode == 0, r
    return r.stdout


@pytest.mark.parametrize("out, err, cap, skip", [
    (b"", b"", 100, 0),
    (b"hello\n", b"", 100, 0),
    (b"", b"an error\n", 100, 0),
    (b"both\n", b"streams\n", 3, 0),                                # over the cap: cut
    (bytes(range(256)) * 900, b"\0" * 70_000 + b"x", 10**7, 0),      # binary, over one 64 KiB read
    (b"0123456789", b"e", 100, 4),                                   # shorter than its size: NULs
])
def test_the_framer_answers_byte_for_byte_as_the_shells_way(tmp_path, out, err, cap, skip):
    shell, framer = tmp_path / "shell", tmp_path / "framer"
    shell.mkdir()
    framer.mkdir()
    _install_framer(framer / "fr")
    want = _answer(str(shell), out, err, cap, skip)                  # wc and dd
    head = b"__FM__ 7 0 0 %d %d\n" % (len(out), len(err))
    body = (out[skip:] + b"\0" * skip)[:cap] + err[:cap]
    assert want == head + body
    assert _answer(str(framer), out, err, cap, skip) == want


def test_the_framer_writes_nothing_without_arguments_and_fails_when_the_channel_does(tmp_path):
    fr = _install_framer(tmp_path / "fr")
    r = subprocess.run([str(fr)], capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (2, b"")
    with open("/dev/full", "wb") as full:                            # every write fails: ENOSPC
        assert subprocess.run([str(fr), "H", "9"], stdout=full, timeout=30).returncode == 3


def _has_pidfd() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


# the framer's stream watches a process through its pidfd (Linux 5.3); without one it
# streams nothing and the agent streams the shell's way (checked in the sandbox tests)
needs_pidfd = pytest.mark.skipif(not _has_pidfd(), reason="this kernel has no pidfd_open")


def _frames(data: bytes) -> list[tuple[bytes, bytes]]:
    """The ``__FMP__ 7 S LEN`` frames of a stream: (S, bytes) each, all of it consumed."""
    out = []
    while data:
        head, _, data = data.partition(b"\n")
        tag, ident, stream, size = head.split(b" ")
        assert (tag, ident) == (b"__FMP__", b"7"), head
        out.append((stream, data[:int(size)]))
        data = data[int(size):]
    return out


def _streamer(fr, pid, cap: int, out_fd: int, err_fd: int, chan_fd: int) -> subprocess.Popen:
    """``fr 7 CAP PID`` started with its fds 5, 6 and 7 those given; its fd 1 (the sizes) a pipe."""
    return subprocess.Popen([str(fr), "7", str(cap), str(pid)], stdout=subprocess.PIPE, pass_fds=(5, 6, 7),
                            preexec_fn=lambda: [os.dup2(out_fd, 5), os.dup2(err_fd, 6), os.dup2(chan_fd, 7)])


def _stream(fr, pid, out_file, err_file, cap: int, skip: int = 0) -> tuple[int, bytes, bytes]:
    """``fr 7 CAP PID`` with fds 5 and 6 on the files (5 read from offset ``skip``), fd 7 a
    pipe: its status, what it wrote to fd 7 (the frames) and to fd 1 (the sizes)."""
    with open(out_file, "rb") as o, open(err_file, "rb") as e:
        o.seek(skip)
        r7, w7 = os.pipe()
        p = _streamer(fr, pid, cap, o.fileno(), e.fileno(), w7)
        os.close(w7)
        with os.fdopen(r7, "rb") as frames:
            sent = frames.read()
        return p.wait(60), sent, p.stdout.read()


@needs_pidfd
def test_the_framer_streams_what_a_process_writes_until_it_ends(tmp_path):
    """``fr ID CAP PID`` sends each stream's new bytes as they come (it waits on the
    process's pidfd between looks, so the end is seen at once), then the sizes on fd 1."""
    fr = _install_framer(tmp_path / "fr")
    out, err = tmp_path / "o", tmp_path / "e"
    with open(out, "wb") as o, open(err, "wb") as e:
        # a process that writes only after each line of its input: the stream must carry
        # the first write before the test sends the next line
        proc = subprocess.Popen(["sh", "-c", "echo one; read -r x; echo two >&2; read -r x; echo three"],
                                stdin=subprocess.PIPE, stdout=o, stderr=e)
    o5, e6 = open(out, "rb"), open(err, "rb")
    r7, w7 = os.pipe()
    streamer = _streamer(fr, proc.pid, 100, o5.fileno(), e6.fileno(), w7)
    os.close(w7)
    frames = os.fdopen(r7, "rb")

    def frame() -> tuple[bytes, bytes]:
        head = frames.readline()
        _, _, stream, size = head.split(b" ")
        return stream, frames.read(int(size))

    try:
        assert frame() == (b"1", b"one\n")
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        assert frame() == (b"2", b"two\n")
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert frame() == (b"1", b"three\n")
        assert streamer.wait(60) == 0 and frames.read() == b""
        assert streamer.stdout.read() == b"10 4\n"                   # the files' sizes
    finally:
        proc.kill()
        streamer.kill()
        for f in (o5, e6, frames):
            f.close()
        proc.wait(60)


@needs_pidfd
@pytest.mark.parametrize("out, err, cap, skip", [
    (b"", b"", 100, 0),
    (b"hello\n", b"an error\n", 3, 0),                               # over the cap: cut
    (bytes(range(256)) * 9000, b"\0" * 70_000 + b"x", 2 << 20, 0),    # over 1 MiB: frames of 1 MiB
    (b"0123456789", b"e", 100, 4),                                   # shorter than its size: NULs
])
def test_the_framer_streams_a_process_that_ended_already_in_full(tmp_path, out, err, cap, skip):
    """A process that has ended (a zombie, or one reaped already: no pidfd to get) is
    streamed as ``dd`` would have sent it: up to the cap, in frames of at most 1 MiB, NULs
    where a file is shorter than its size; then the whole sizes."""
    fr = _install_framer(tmp_path / "fr")
    (tmp_path / "o").write_bytes(out)
    (tmp_path / "e").write_bytes(err)
    ended = subprocess.Popen(["true"])
    os.waitid(os.P_PID, ended.pid, os.WEXITED | os.WNOWAIT)           # ended, not yet reaped
    body = (out[skip:] + b"\0" * skip)[:cap]
    want = [(b"1", body[i:i + (1 << 20)]) for i in range(0, len(body), 1 << 20)]
    want += [(b"2", err[:cap])] if err else []
    sizes = b"%d %d\n" % (len(out), len(err))
    for pid in (ended.pid, 4194305):                                 # a zombie; no such process
        rc, sent, printed = _stream(fr, pid, tmp_path / "o", tmp_path / "e", cap, skip)
        assert (rc, _frames(sent), printed) == (0, want, sizes)
    ended.wait(60)


def test_the_framer_streams_nothing_where_it_cannot_watch_the_process(tmp_path):
    """No pidfd for the process (here PID 0: EINVAL; or none on this kernel): exit 4 having
    written nothing, and the agent streams the shell's way.  A channel that fails: exit 3."""
    fr = _install_framer(tmp_path / "fr")
    (tmp_path / "o").write_bytes(b"x")
    assert _stream(fr, 0, tmp_path / "o", tmp_path / "o", 9) == (4, b"", b"")
    if not _has_pidfd():
        return
    with open("/dev/full", "wb") as full, open(tmp_path / "o", "rb") as o:
        streamer = _streamer(fr, 4194305, 9, o.fileno(), o.fileno(), full.fileno())
        assert streamer.wait(30) == 3
        streamer.stdout.close()


def test_the_agent_keeps_the_framer_only_once_it_answered_a_known_file(tmp_path):
    def prep(dirpath, env=None):
        script = _COMMON + FRAMER + f'__fm_d={dirpath}; __fm_frprep; ls -a "$__fm_d"\n'
        r = subprocess.run(["dash", "-c", script], capture_output=True, text=True, timeout=30,
                           env=env or {"PATH": os.environ["PATH"]})
        assert r.returncode == 0, r
        return set(r.stdout.split()) - {".", ".."}
    (tmp_path / "a").mkdir()
    assert prep(tmp_path / "a") == {"fr"} and (tmp_path / "a" / "fr").read_bytes() == FRAMER_X86_64
    bare = tmp_path / "bin"                                           # no chmod: nothing kept
    bare.mkdir()
    for tool in ("mv", "rm", "ls", "dash"):
        (bare / tool).symlink_to(shutil.which(tool))
    (tmp_path / "b").mkdir()
    assert prep(tmp_path / "b", env={"PATH": str(bare)}) == set()


def test_the_framers_source_assembles_to_its_bytes(tmp_path):
    if shutil.which("as") is None or shutil.which("objcopy") is None:
        pytest.skip("GNU as and objcopy are not installed")
    (tmp_path / "fr.s").write_text(".intel_syntax noprefix\n" + "\n".join(
        line[4:] for line in FRAMER_SOURCE.splitlines() if not line.strip().startswith(".intel_syntax")) + "\n")
    subprocess.run(["as", "-o", str(tmp_path / "fr.o"), str(tmp_path / "fr.s")], check=True, timeout=60)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(tmp_path / "fr.o"), str(tmp_path / "fr.bin")],
                   check=True, timeout=60)
    assert (tmp_path / "fr.bin").read_bytes() == FRAMER_CODE


# ---- the agent itself, on this host -------------------------------------------------------

@needs_pidfd
@pytest.mark.parametrize("ident", [2, 4, 126, 127, 9])
def test_a_streamed_command_killed_at_its_timeout_is_answered_once_whatever_its_id(tmp_path, ident):
    """The agent (dash, on this host: the protocol by hand) streams a command its timeout
    kills through the framer, and its answer ends with the end frame alone.  The agent once
    kept the framer's status in a name its watcher's check reuses for the command's id: an
    id of 2, 4, 126 or 127 then made it stream the output a second time, as NULs."""
    if shutil.which("bash") is None or shutil.which("setsid") is None:
        pytest.skip("the agent's watcher needs bash, and setsid")
    agent = subprocess.Popen(["dash", "-c", AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)},
                             start_new_session=True)
    try:
        ready = agent.stdout.readline().split()
        assert ready[0] == b"__FM_READY__", ready
        _install_framer(tmp_path / f".flowmesh-{ready[1].decode()}" / "fr")
        script = b"echo first; sleep 30 & sleep 31; echo never\n"
        agent.stdin.write(_frame_head("__fm_proc", ident, "0.300", 1000, script, 0) + script)
        agent.stdin.flush()
        lines = [agent.stdout.readline()]
        assert lines[0].startswith(b"__FMP__ %d pid " % ident), lines
        while not lines[-1].startswith(b"__FMP__ %d end" % ident):
            line = agent.stdout.readline()
            if line.startswith(b"__FMP__ %d 1 " % ident):
                line += agent.stdout.read(int(line.split()[3]))
            lines.append(line)
        agent.stdin.write(b"__fm_end\n")
        agent.stdin.flush()
        lines.append(agent.stdout.readline())
        assert lines[1:] == [b"__FMP__ %d 1 6\nfirst\n" % ident, b"__FMP__ %d end 137 1 6 0\n" % ident,
                             b"__FMP__ %d idle\n" % ident]
    finally:
        os.killpg(agent.pid, signal.SIGKILL)    # the agent and its watcher (its standby ends with it)
        agent.wait(60)
