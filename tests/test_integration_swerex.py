"""FlowMeshDeployment / FlowMeshRuntime driven as SWE-ReX's client code drives a deployment
(SWE-agent: start, create a bash session from startup files, run actions with timeouts and
check modes, interrupt, execute Commands, move files, stop), with the installed swe-rex
package's own request models -- validated from the JSON shapes its server accepts -- and
its own exception classes, on real podman (the Debian image: bash; the busybox image: ash
where a test says so), held against SWE-ReX's own LocalRuntime where that is cheap."""

from __future__ import annotations

import asyncio
import importlib
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("swerex")

from pydantic import TypeAdapter  # noqa: E402
from swerex.deployment.abstract import AbstractDeployment  # noqa: E402
from swerex.exceptions import (BashIncorrectSyntaxError, CommandTimeoutError, DeploymentNotStartedError,  # noqa: E402
                               NonZeroExitCodeError, SessionDoesNotExistError, SessionExistsError,
                               SwerexException)
from swerex.runtime.abstract import (AbstractRuntime, Action, BashAction, BashInterruptAction,  # noqa: E402
                                     CloseBashSessionRequest, Command, CreateBashSessionRequest,
                                     ReadFileRequest, UploadRequest, WriteFileRequest)
from swerex.runtime.local import LocalRuntime  # noqa: E402

from flowmesh_sdk import SandboxSpec  # noqa: E402
from flowmesh_sdk.errors import FlowMeshError, IntegrationMissingError  # noqa: E402
from flowmesh_sdk.integrations.swerex import FlowMeshDeployment, FlowMeshRuntime, SandboxLostError  # noqa: E402
from conftest import local_pool  # noqa: E402

ACTION = TypeAdapter(Action)   # what SWE-ReX's server does with a /run_in_session body


@pytest.fixture(scope="module")
async def pool(tmp_path_factory, swe_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-swerex"), "rex") as (_, p):
        yield p


@pytest.fixture
async def deployment(pool, swe_image):
    d = FlowMeshDeployment(pool, spec=SandboxSpec(image=swe_image, cpus=1, memory_gb=0.5))
    assert isinstance(d, AbstractDeployment)
    with pytest.raises(DeploymentNotStartedError):
        d.runtime
    with pytest.raises(DeploymentNotStartedError):
        await d.is_alive()
    await d.start()
    assert isinstance(d.runtime, AbstractRuntime) and isinstance(d.runtime, FlowMeshRuntime)
    yield d
    await d.stop()
    await d.stop()                      # idempotent
    with pytest.raises(DeploymentNotStartedError):
        d.runtime


async def test_bash_session_as_swe_agent_drives_it(deployment):
    rt = deployment.runtime
    assert await deployment.is_alive()
    await rt.write_file(WriteFileRequest(path="/root/.fmrc", content="export FROM_RC=rc\ncd /tmp\n"))
    r = await rt.create_session(CreateBashSessionRequest(startup_source=["/root/.fmrc"], startup_timeout=10))
    assert r.output == ""
    with pytest.raises(SessionExistsError):
        await rt.create_session(CreateBashSessionRequest())

    obs = await rt.run_in_session(ACTION.validate_python(
        {"action_type": "bash", "command": "mkdir -p w && cd w && X=local && greet() { echo \"hi $1\"; }",
         "timeout": 30}))
    assert obs.exit_code == 0 and obs.output == ""
    # state persists; stdout and stderr come back merged, in order
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$X|$FROM_RC"; greet you; echo oops >&2; echo end',
                                             timeout=30))
    assert (obs.output, obs.exit_code) == ("/tmp/w\nlocal|rc\nhi you\noops\nend\n", 0)
    # multi-line commands and heredocs run as one action
    obs = await rt.run_in_session(BashAction(command="cat <<'EOF'\nline $X\nEOF\necho after", timeout=30))
    assert obs.output == "line $X\nafter\n"

    # check modes
    with pytest.raises(NonZeroExitCodeError, match=r"setup: Command 'false' failed with exit code 1"):
        await rt.run_in_session(BashAction(command="false", timeout=30, error_msg="setup"))
    obs = await rt.run_in_session(BashAction(command="echo x; (exit 3)", timeout=30, check="silent"))
    assert (obs.output, obs.exit_code) == ("x\n", 3)
    obs = await rt.run_in_session(BashAction(command="echo y; (exit 4)", timeout=30, check="ignore"))
    assert (obs.output, obs.exit_code) == ("y\n", None)

    # a syntax error is SWE-ReX's BashIncorrectSyntaxError, and nothing ran
    with pytest.raises(BashIncorrectSyntaxError) as ei:
        await rt.run_in_session(BashAction(command="touch /tmp/ran; echo 'unterminated", timeout=30))
    assert "unexpected EOF" in ei.value.extra_info["bash_stderr"]
    assert (await rt.execute(Command(command=["test", "-e", "/tmp/ran"]))).exit_code == 1

    # a timeout raises CommandTimeoutError; SWE-agent then interrupts; the session goes on
    with pytest.raises(CommandTimeoutError, match="timeout after 1.0 seconds"):
        await rt.run_in_session(BashAction(command="sleep 60; echo not-reached", timeout=1.0))
    obs = await rt.run_in_session(BashInterruptAction())
    assert obs.exit_code == 0
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$X"', timeout=30))
    assert obs.output == "/tmp/w\nlocal\n"

    # an interrupt while a command runs stops it (Ctrl-C)
    running = asyncio.create_task(rt.run_in_session(BashAction(command="sleep 60", timeout=None, check="silent")))
    for _ in range(200):
        if rt.sessions["default"].running:
            break
        await asyncio.sleep(0.02)
    await rt.run_in_session(ACTION.validate_python({"action_type": "bash_interrupt"}))
    obs = await asyncio.wait_for(running, 20)
    assert obs.exit_code == 130

    # a command that ends the shell: the session restarts; the sandbox is not "lost"
    with pytest.raises(SwerexException) as ei:
        await rt.run_in_session(BashAction(command="kill -9 $$", timeout=30))
    assert not isinstance(ei.value, SandboxLostError)
    assert await deployment.is_alive()

    # a second session is independent; closing one
    await rt.create_session(CreateBashSessionRequest(session="other"))
    obs = await rt.run_in_session(BashAction(session="other", command='echo "[$X]"; pwd', timeout=30))
    assert obs.output == "[]\n/\n"
    await rt.close_session(CloseBashSessionRequest(session="other"))
    with pytest.raises(SessionDoesNotExistError):
        await rt.run_in_session(BashAction(session="other", command="true"))
    with pytest.raises(SessionDoesNotExistError):
        await rt.close_session(CloseBashSessionRequest(session="other"))


async def test_interactive_programs_run_as_swerex_runs_them(deployment, rex_local):
    # issue 24: a REPL on the session's pseudo-terminal, held against SWE-ReX's LocalRuntime
    rt = deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    both = (rt, rex_local)

    async def run(**kw):
        return [await r.run_in_session(BashAction(**kw)) for r in both]

    await run(command="cd /tmp && export MY_VAR=from-session && UNEXPORTED=1", timeout=30)
    obs = await run(command="python3 -q", is_interactive_command=True, expect=[">>> "], timeout=30)
    assert [o.expect_string for o in obs] == [">>> ", ">>> "], obs
    # the session's cwd and environment carry into the program; its answers come back
    obs = await run(command="import os; print(os.getcwd(), os.environ.get('MY_VAR'), "
                            "os.environ.get('UNEXPORTED'))", is_interactive_command=True, expect=[">>> "], timeout=30)
    assert [o.output for o in obs] == ["/tmp from-session None"] * 2, obs
    obs = await run(command="x = 6 * 7", is_interactive_command=True, expect=[">>> "], timeout=30)
    obs = await run(command="print(x)", is_interactive_command=True, expect=[">>> "], timeout=30)
    assert [(o.output, o.exit_code) for o in obs] == [("42", 0)] * 2, obs
    # past its timeout the program keeps running; an interrupt is Ctrl-C, and the REPL goes on
    for r in both:
        with pytest.raises(CommandTimeoutError):
            await r.run_in_session(BashAction(command="import time; time.sleep(60)", is_interactive_command=True,
                                              expect=[">>> "], timeout=1))
    obs = [await r.run_in_session(BashInterruptAction(expect=[">>> "], timeout=10)) for r in both]
    assert all("KeyboardInterrupt" in o.output and o.expect_string == ">>> " for o in obs), obs
    obs = await run(command="print(x + 1)", is_interactive_command=True, expect=[">>> "], timeout=30)
    assert [o.output for o in obs] == ["43"] * 2, obs
    obs = await run(command="exit()", is_interactive_quit=True, timeout=30)
    assert [o.exit_code for o in obs] == [0, 0], obs
    assert not rt._terminals                                      # the terminal went with the program
    # the session's shell was not touched: its state is as it was
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$MY_VAR $UNEXPORTED"', timeout=30))
    assert obs.output == "/tmp\nfrom-session 1\n", obs
    # a program that ends by itself: the prompt is what matched
    obs = await run(command="python3 -c 'print(7)'", is_interactive_command=True, expect=[">>> "], timeout=30)
    assert [(o.output.strip(), o.expect_string) for o in obs] == [("7", "SHELLPS1PREFIX")] * 2, obs
    # a pager pages (the terminal has rows) and quits on q
    obs = await rt.run_in_session(BashAction(command="seq 1 500 | more", is_interactive_command=True,
                                             expect=["--More--"], timeout=30))
    lines = obs.output.split()
    assert obs.expect_string == "--More--" and lines[:3] == ["1", "2", "3"] and "500" not in lines, obs
    obs = await rt.run_in_session(BashAction(command="q", is_interactive_quit=True, timeout=30))
    assert obs.expect_string == "SHELLPS1PREFIX", obs
    await rt.close_session(CloseBashSessionRequest())


@pytest.fixture(params=["busybox", "debian"])
async def any_deployment(request, pool, busybox_image, swe_image):
    """A started deployment on each image a session runs on (busybox: ash, Debian: bash)."""
    image = busybox_image if request.param == "busybox" else swe_image
    d = FlowMeshDeployment(pool, spec=SandboxSpec(image=image, cpus=1, memory_gb=0.5))
    await d.start()
    yield d
    await d.stop()


@pytest.fixture
async def rex_local():
    """SWE-ReX's own LocalRuntime with a bash session on this machine: the reference.  Its
    bash is started with SIGINT handled as at a terminal: a suite run as a background job
    inherits SIGINT ignored, and the programs of a bash started so could not be interrupted
    (the reference's Ctrl-C would fall back to ^Z and kill)."""
    was = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rt = LocalRuntime()
        await rt.create_session(CreateBashSessionRequest(startup_timeout=30))
    finally:
        signal.signal(signal.SIGINT, was)
    yield rt
    await rt.close()


async def _raised(call) -> tuple[type, str] | None:
    """The class and message of what ``call`` raised, or None."""
    try:
        await call
    except Exception as exc:   # noqa: BLE001 -- the test compares whatever was raised
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox"])
def test_an_executes_cwd_or_program_fails_as_subprocess_run_fails(shell, tmp_path):
    """The script ``execute`` runs, on this machine's shells (the images' /bin/sh: dash,
    bash, busybox ash): what ``subprocess.run`` raises before its program runs comes back as
    the same OSError; everything else runs, its status its own."""
    from flowmesh_sdk.integrations._swerex_scripts import _command_script, _exec_error, _exec_failed, _why_script
    (tmp_path / "run.sh").write_text("#!/bin/sh\nexit 127\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "plain").write_text("x\n")
    here = str(tmp_path)
    cases = [Command(command=["no-such-program"]), Command(command="no-such-program"),
             Command(command=["/etc/passwd"]), Command(command=["/etc"]), Command(command=["/no/dir/prog"]),
             Command(command=["true"], cwd="/no/such"), Command(command=["true"], cwd="/etc/passwd"),
             Command(command=["ls"], env={"A": "1"}), Command(command=["ls"], env={"PATH": "/nowhere"}),
             Command(command=["./run.sh"], cwd=here), Command(command=["./plain"], cwd=here),
             Command(command=["plain"], env={"PATH": here}), Command(command=["plain"], env={"PATH": f"{here}:/bin"}),
             Command(command=["run.sh"], env={"PATH": f"/nowhere::{here}"}),
             Command(command="no-such-program", shell=True), Command(command=["sh", "-c", "exit 127"]),
             Command(command=["cd", "/"]), Command(command=["export"]),     # the shell's builtins, no programs
             Command(command=["plain"]), Command(command=["run.sh"]),     # on the path only in the second round
             Command(command=["plain"], merge_output_streams=True)]       # the shell's message, then the mark
    argv = ["busybox", "sh", "-c"] if shell == "busybox" else [shell, "-c"]
    for path in (os.environ["PATH"], f"{here}:{os.environ['PATH']}"):
        for c in cases:
            env = {**os.environ, "PATH": path}
            try:
                want: object = subprocess.run(c.command, shell=c.shell, env=c.env or env, cwd=c.cwd,
                                              capture_output=True).returncode
            except OSError as exc:
                want = (type(exc), str(exc), exc.errno, exc.filename)
            nonce = "n0nce"
            r = subprocess.run([*argv, _command_script(c, nonce)], capture_output=True, text=True, env=env)
            got = r.returncode
            if r.returncode == 127 and (failed := _exec_failed(r.stdout, nonce)):
                what, why = failed
                why = why or subprocess.run([*argv, _why_script(c, what)], capture_output=True, text=True,
                                            env=env).stdout.strip()
                exc = _exec_error(c, what, why)
                got = (type(exc), str(exc), exc.errno, exc.filename)
            assert got == want, (c, path)


async def test_empty_and_comment_only_commands_run_as_swerex_runs_them(any_deployment, rex_local):
    # issue 24 (15): old code raised BashIncorrectSyntaxError (near unexpected token `}')
    rt = any_deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(BashAction(command="cd /tmp && X=kept", timeout=30))
    for cmd in ("", "\n", "   ", "# echo hi", "  # a comment\n\n# another\n"):
        ref = await rex_local.run_in_session(BashAction(command=cmd, timeout=30))
        obs = await rt.run_in_session(BashAction(command=cmd, timeout=30))      # check="raise"
        assert (obs.output, obs.exit_code) == ("", 0), cmd
        # SWE-ReX's output is the pty's line ends only
        assert (ref.output.strip(), ref.exit_code) == (obs.output, obs.exit_code), cmd
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$X"', timeout=30))
    assert (obs.output, obs.exit_code) == ("/tmp\nkept\n", 0)


async def test_a_syntax_error_is_the_commands_own_as_swerex_reports_it(any_deployment, rex_local):
    # issue 24 (16): old code quoted the wrapper (near unexpected token `}', `} 2>&1')
    rt = any_deployment.runtime
    bash = "busybox" not in any_deployment.sandbox.spec.image
    await rt.create_session(CreateBashSessionRequest())
    # under `set -e` too, a command that does not parse leaves the shell and its state alone
    await rt.run_in_session(BashAction(command="cd /tmp && X=kept && set -e", timeout=30))
    for cmd in ("(a", "if true; then", "f() { echo", "echo a\n)\necho b", "fi", "for",
                "touch /tmp/ran; echo 'unterminated"):
        with pytest.raises(BashIncorrectSyntaxError) as ours:
            await rt.run_in_session(BashAction(command=cmd, timeout=30))
        info = ours.value.extra_info
        assert info["bash_stdout"] == "" and info["bash_stderr"].endswith("\n"), info
        assert not any(w in info["bash_stderr"] for w in ("`}'", 'unexpected "}"', "} 2>&1", ".flowmesh")), info
        if bash:       # exactly what SWE-ReX raises: its message, its extra_info
            with pytest.raises(BashIncorrectSyntaxError) as ref:
                await rex_local.run_in_session(BashAction(command=cmd, timeout=30))
            assert (str(ours.value), info) == (str(ref.value), ref.value.extra_info)
        else:          # the session shell's own parser (busybox ash) on the command
            assert info["bash_stderr"].startswith("sh: syntax error: "), info
            assert str(ours.value).startswith(f"Error (exit code 2) while checking bash command \n{cmd!r}\n")
    assert (await rt.execute(Command(command=["test", "-e", "/tmp/ran"]))).exit_code == 1   # nothing ran
    obs = await rt.run_in_session(BashAction(command='pwd; echo "$X"', timeout=30))
    assert (obs.output, obs.exit_code) == ("/tmp\nkept\n", 0)
    assert rt.sessions["default"].restarts == 0


async def test_exit_in_a_session_returns_its_status_and_the_session_goes_on(any_deployment):
    # issue 24 (8), through SWE-ReX's calls: old code raised for `exit 3` (bash) or said exit 0 (ash)
    rt = any_deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(BashAction(command="cd /tmp && X=gone", timeout=30))
    obs = await rt.run_in_session(BashAction(command="echo bye; exit 3", timeout=30, check="silent"))
    assert (obs.output, obs.exit_code) == ("bye\n", 3)
    obs = await rt.run_in_session(BashAction(command='echo "[$X]"', timeout=30))     # a fresh shell
    assert (obs.output, obs.exit_code) == ("[]\n", 0)


async def test_execute_commands_and_files(deployment, rex_local, tmp_path):
    rt = deployment.runtime
    r = await rt.execute(Command(command=["sh", "-c", 'echo "a b"; echo err >&2; exit 3', "ignored"]))
    assert (r.stdout, r.stderr, r.exit_code) == ("a b\n", "err\n", 3)
    r = await rt.execute(Command(command="echo out; echo err >&2", shell=True, merge_output_streams=True))
    assert (r.stdout, r.stderr, r.exit_code) == ("out\nerr\n", "", 0)
    r = await rt.execute(Command(command=["printf", "%s|", "with space", "$HOME", ";rm -rf /"]))
    assert r.stdout == "with space|$HOME|;rm -rf /|"           # argv: no shell involved
    r = await rt.execute(Command(command="pwd; echo ${ONLY:-unset} ${HOME:-nohome}", shell=True, cwd="/tmp",
                                 env={"ONLY": "this"}))
    assert r.stdout == "/tmp\nthis nohome\n"                  # env replaces the environment
    with pytest.raises(NonZeroExitCodeError, match="compile: Command"):
        await rt.execute(Command(command="exit 2", shell=True, check=True, error_msg="compile"))
    with pytest.raises(CommandTimeoutError, match=r"Timeout \(1.0s\)"):
        await rt.execute(Command(command=["sleep", "30"], timeout=1.0))
    # what subprocess.run raises before the program runs, raised as SWE-ReX's own runtime raises it
    for bad in (Command(command=["no-such-program"]), Command(command="pwd", shell=True, cwd="/no/such/dir"),
                Command(command=["/etc/passwd"]), Command(command=["true"], cwd="/etc/passwd"),
                Command(command=["ls"], env={"PATH": "/nowhere"})):
        want = await _raised(rex_local.execute(bad))
        assert want is not None and issubclass(want[0], OSError), bad
        assert await _raised(rt.execute(bad)) == want, bad
    r = await rt.execute(Command(command="no-such-program", shell=True))   # the shell's own 127
    assert r.exit_code == 127 and "no-such-program" in r.stderr
    assert (await rt.execute(Command(command=["ls", "/"], env={"A": "1"}))).exit_code == 0   # PATH: /bin:/usr/bin
    # concurrent executes each get their own answer; repeated ones ran on held /bin/sh sessions
    outs = await asyncio.gather(*(rt.execute(Command(command=["echo", str(i)])) for i in range(6)))
    assert [o.stdout for o in outs] == [f"{i}\n" for i in range(6)]
    assert any(name.startswith("swerex-execute-") for name in deployment.sandbox.sessions)

    await rt.write_file(WriteFileRequest(path="/work/deep/dir/f.txt", content="héllo\n"))
    assert (await rt.read_file(ReadFileRequest(path="/work/deep/dir/f.txt"))).content == "héllo\n"
    with pytest.raises(FileNotFoundError):
        await rt.read_file(ReadFileRequest(path="/work/nope.txt"))
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    await rt.upload(UploadRequest(source_path=str(src), target_path="/work/proj"))
    r = await rt.execute(Command(command="cat pkg/m.py && ./run.sh", shell=True, cwd="/work/proj"))
    assert r.stdout == "X = 1\nran\n"
    await rt.upload(UploadRequest(source_path=str(src / "run.sh"), target_path="/work/one/run.sh"))
    assert (await rt.execute(Command(command=["/work/one/run.sh"]))).stdout == "ran\n"
    with pytest.raises(FileNotFoundError):
        await rt.upload(UploadRequest(source_path=str(tmp_path / "missing"), target_path="/work/x"))


async def test_sandbox_lost_under_a_session(deployment):
    rt = deployment.runtime
    await rt.create_session(CreateBashSessionRequest())
    assert (await rt.run_in_session(BashAction(command="echo up", timeout=30))).output == "up\n"
    subprocess.run(["podman", "rm", "-f", "-t", "0", deployment.sandbox.container_id], check=True,
                   capture_output=True)
    with pytest.raises(SandboxLostError) as ei:
        await rt.run_in_session(BashAction(command="echo again", timeout=30))
    assert isinstance(ei.value, SwerexException) and isinstance(ei.value.__cause__, FlowMeshError)
    assert ei.value.infra_failure is None    # the container alone went; its instance is fine
    alive = await deployment.is_alive()
    assert not alive and "sandbox lost" in alive.message
    with pytest.raises(SandboxLostError):
        await rt.execute(Command(command=["true"]))
    await deployment.stop()             # stopping a lost deployment is fine


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.delitem(sys.modules, "flowmesh_sdk.integrations.swerex")
    monkeypatch.setitem(sys.modules, "swerex", None)          # as if swe-rex were not installed
    with pytest.raises(IntegrationMissingError, match=r"pip install 'flowmesh-sdk\[swerex\]'") as ei:
        importlib.import_module("flowmesh_sdk.integrations.swerex")
    assert isinstance(ei.value, ImportError) and "swe-rex" in str(ei.value)


def test_the_core_imports_no_integration_package():
    code = ("import sys, flowmesh_sdk, flowmesh_sdk.fleet, flowmesh_sdk.sync, flowmesh_sdk.reuse, "
            "flowmesh_sdk.integrations; "
            "print(sorted(m for m in ('swerex', 'minisweagent', 'trl', 'litellm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
