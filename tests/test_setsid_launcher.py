"""The agent's static programs, run on this host: the session launcher
(flowmesh_sdk/sandbox/_setsid.py, 230 bytes) and the answer framer (_framer.py) it writes
into an x86-64 sandbox, their printf form in the shells an agent may run under, and the
agent's checks that keep them only where they work."""

import os
import platform
import shutil
import subprocess

import pytest

from flowmesh_sdk.sandbox._agent import _COMMON
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
