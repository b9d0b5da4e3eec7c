"""The agent's session launcher (flowmesh_sdk/sandbox/_setsid.py), run on this host: the
230 bytes it writes into an x86-64 sandbox, and their printf form in the shells an agent
may run under."""

import os
import platform
import shutil
import subprocess

import pytest

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
    data = bytes(range(256)) + SETSID_X86_64
    out = subprocess.run([*argv, "-c", 'printf "$1"', "sh", printf_format(data)], capture_output=True,
                         timeout=30).stdout
    assert out == data


def _prep(dirpath: str, *, env: dict[str, str] | None = None, wrap: tuple[str, ...] = ()) -> set[str]:
    """Run the agent's __fm_ssprep (dash) for the agent directory ``dirpath``: what is in it after."""
    script = LAUNCHER + f'__fm_ss=setsid; __fm_d={dirpath}; __fm_ssprep; ls -a "$__fm_d"\n'
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
