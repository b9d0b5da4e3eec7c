"""A SWE-ReX deployment on a FlowMesh pool (extra ``[swerex]``).

SWE-agent, SWE-smith and other SWE-ReX users run commands through a deployment
(``AbstractDeployment``) and its ``runtime`` (``AbstractRuntime``).  Switch
``DockerDeployment(image=...)`` for :class:`FlowMeshDeployment` ``(pool, image=...)``
and the same calls run in a sandbox of a FlowMesh pool: a warm container in
milliseconds instead of a container start plus a server inside it.

    from flowmesh_sdk.integrations.swerex import FlowMeshDeployment
    deployment = FlowMeshDeployment(pool, image="localhost/flowmesh/swe-base:bookworm")
    await deployment.start()                       # then exactly as with DockerDeployment:
    await deployment.runtime.create_session(CreateBashSessionRequest())
    obs = await deployment.runtime.run_in_session(BashAction(command="cd /work && ls", timeout=30))

:class:`FlowMeshRuntime` takes SWE-ReX's own request models and answers with its response
models and exception classes:

* ``create_session`` starts a shell session of the sandbox (bash when the image has it)
  and sources ``startup_source``; a second session of one name is ``SessionExistsError``.
* ``run_in_session(BashAction)`` runs the command in that session (cd, variables and
  functions persist); ``output`` is stdout and stderr merged in order.  As SWE-ReX does,
  the command is first checked with ``bash -n`` (the session shell's own ``-n``): a syntax
  error is ``BashIncorrectSyntaxError`` with that check's own message, and nothing of the
  command ran; an empty or comment-only command is exit 0 with empty output;
  past ``timeout`` the command's processes are killed and ``CommandTimeoutError`` is
  raised (the session goes on); ``check="raise"`` raises ``NonZeroExitCodeError``,
  ``"silent"`` returns the exit code, ``"ignore"`` returns ``exit_code=None``.
  ``BashInterruptAction`` interrupts the running command as Ctrl-C.
* Interactive programs (``is_interactive_command`` / ``is_interactive_quit``, a REPL,
  gdb, a pager) run on a pseudo-terminal of the session (:meth:`Sandbox.terminal`),
  opened at the session's first such command in the session's cwd and with its
  environment: the command is typed there and its output read until one of ``expect``
  or the prompt (SWE-ReX's ``SHELLPS1PREFIX``) shows; ``expect_string`` names which.
  Past ``timeout`` it is ``CommandTimeoutError`` and the program keeps running (a
  ``BashInterruptAction`` sends it Ctrl-C).  ``is_interactive_quit`` and a program that
  ends (the prompt shows) close the terminal; the session's other commands run in its
  shell as before.
* ``execute(Command)`` runs an argv list or (``shell=True``) a string like
  ``subprocess.run``: ``env`` replaces the environment, ``cwd``, ``merge_output_streams``,
  ``check`` and ``timeout`` as there.  The first runs with ``sandbox.exec`` (a fresh
  ``/bin/sh``); a runtime that executes again keeps a few ``/bin/sh`` sessions and runs
  each command in a subshell of an idle one (a fork instead of a fresh session: about
  half the round trip).
* ``read_file`` / ``write_file`` / ``upload`` go over the sandbox's channel.

When the sandbox is lost (its container or instance gone), every call raises
:class:`SandboxLostError` (a ``SwerexException``, chained to the FlowMesh error) and
``is_alive()`` reports ``False`` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import secrets
import shlex
from collections.abc import AsyncIterator
from typing import Any

from . import require

require("swerex", package="swe-rex", extra="swerex")

from swerex.deployment.abstract import AbstractDeployment  # noqa: E402
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook  # noqa: E402
from swerex.exceptions import (BashIncorrectSyntaxError, CommandTimeoutError,  # noqa: E402
                               DeploymentNotStartedError, NonZeroExitCodeError, SessionDoesNotExistError,
                               SessionExistsError, SwerexException)
from swerex.runtime.abstract import (AbstractRuntime, BashAction, BashInterruptAction,  # noqa: E402
                                     BashObservation, CloseBashSessionResponse, CloseResponse, Command,
                                     CommandResponse, CreateBashSessionRequest, CreateBashSessionResponse,
                                     IsAliveResponse, ReadFileRequest, ReadFileResponse, UploadRequest,
                                     UploadResponse, WriteFileRequest, WriteFileResponse)

from ..errors import (ContainerRuntimeError, FlowMeshError, InstanceLost, SandboxClosedError,  # noqa: E402
                      SandboxFileError, SandboxTimeout, SpecError)
from ..sandbox import Sandbox, Session, Terminal  # noqa: E402
from ..pools.failures import lost_kind  # noqa: E402
from ..specs import InfraFailure, SandboxSpec  # noqa: E402

__all__ = ["FlowMeshDeployment", "FlowMeshRuntime", "SandboxLostError"]

log = logging.getLogger("flowmesh.integrations.swerex")

#: what ``timeout=None`` ("no timeout") becomes: the longest a FlowMesh command may run
NO_TIMEOUT_S = 7 * 86400.0
#: SWE-ReX's BashSession prompt: what a finished command's ``expect_string`` is
PS1 = "SHELLPS1PREFIX"
_SYNTAX_MARK = "__FM_SYNTAX__"   # + a nonce and the check's status: stdout of a command that did not parse
_EXEC_SHELLS = 4                 # idle /bin/sh sessions kept for execute()
_ALIVE_TIMEOUT_S = 10.0
#: the shell's own variables, not carried from a session into its terminal
_SHELL_OWN = frozenset({"PS1", "PS2", "PS0", "PROMPT_COMMAND", "PWD", "OLDPWD", "SHLVL", "_"})
# the errors that mean the sandbox (or the channel to it) is gone
_LOST = (SandboxClosedError, InstanceLost, SandboxTimeout, ContainerRuntimeError)


class SandboxLostError(SwerexException, RuntimeError):
    """The FlowMesh sandbox under the runtime is gone (container removed, instance lost,
    channel dead).  ``__cause__`` is the FlowMesh error; ``infra_failure`` is
    ``PREEMPTED`` or ``INSTANCE_LOST`` when its instance went away (mask that rollout),
    None when the sandbox alone died under the agent's commands (its own outcome)."""

    def __init__(self, message: str, infra_failure: InfraFailure | None = None) -> None:
        super().__init__(message)
        self.infra_failure = infra_failure


class FlowMeshRuntime(AbstractRuntime):
    """SWE-ReX's runtime interface on one FlowMesh :class:`~flowmesh_sdk.sandbox.Sandbox`."""

    def __init__(self, sandbox: Sandbox, *, logger: logging.Logger | None = None) -> None:
        self.sandbox = sandbox
        self.logger = logger or log
        self._sessions: dict[str, Session] = {}
        self._terminals: dict[str, Terminal] = {}    # a session's interactive program, while it runs
        self._lost: str = ""
        self._lost_infra: InfraFailure | None = None
        self._exec_idle: list[Session] = []          # held /bin/sh sessions for execute()
        self._exec_ids = itertools.count(1)
        self._executes = 0
        self._warming: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"FlowMeshRuntime({self.sandbox!r}, sessions={sorted(self._sessions)})"

    @property
    def sessions(self) -> dict[str, Session]:
        return dict(self._sessions)

    @contextlib.asynccontextmanager
    async def _guard(self, what: str) -> AsyncIterator[None]:
        if self._lost:
            raise SandboxLostError(f"{self.sandbox.name}: the sandbox was lost ({self._lost}); {what} "
                                   "cannot run", self._lost_infra)
        try:
            yield
        except _LOST as exc:
            if not self.sandbox.closed and await self._answers():
                # only this session's shell ended (`kill $$`, `exec 7>&-`): the sandbox is fine
                raise SwerexException(f"{self.sandbox.name}: {what} failed, the sandbox is alive: "
                                      f"{exc}") from exc
            self._lost = f"{type(exc).__name__}: {exc}"
            self._lost_infra = lost_kind(exc)
            self.logger.warning("%s: sandbox lost during %s: %s", self.sandbox.name, what, self._lost)
            raise SandboxLostError(f"{self.sandbox.name}: the sandbox was lost during {what}: "
                                   f"{self._lost}", self._lost_infra) from exc

    async def _answers(self) -> bool:
        try:
            return (await self.sandbox.exec("true", timeout_s=_ALIVE_TIMEOUT_S)).ok
        except FlowMeshError:
            return False

    # ---- liveness ---------------------------------------------------------------------
    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """True when a command round trip in the sandbox answers within ``timeout``."""
        if self._lost:
            return IsAliveResponse(is_alive=False, message=f"sandbox lost: {self._lost}")
        if self.sandbox.closed:
            return IsAliveResponse(is_alive=False, message=f"{self.sandbox.name} is closed")
        try:
            r = await self.sandbox.exec("true", timeout_s=timeout or _ALIVE_TIMEOUT_S)
        except _LOST as exc:
            self._lost = f"{type(exc).__name__}: {exc}"
            self._lost_infra = lost_kind(exc)
            return IsAliveResponse(is_alive=False, message=f"sandbox lost: {self._lost}")
        if not r.ok:
            return IsAliveResponse(is_alive=False, message=f"`true` failed in the sandbox: exit {r.exit_code} "
                                                           f"{r.stderr.strip()[-300:]}")
        return IsAliveResponse(is_alive=True)

    # ---- sessions ---------------------------------------------------------------------
    async def create_session(self, request: CreateBashSessionRequest) -> CreateBashSessionResponse:
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        async with self._guard(f"create_session({request.session!r})"):
            try:
                session = self.sandbox.session(request.session)
            except SpecError as exc:
                raise SwerexException(f"cannot create session {request.session!r}: {exc}") from exc
            self._sessions[request.session] = session
            try:
                # the first command starts the shell (not bounded by startup_timeout, which
                # SWE-ReX applies to sourcing the startup files)
                await session.run(":", timeout_s=60)
                output = ""
                if request.startup_source:
                    script = "\n".join(f". {shlex.quote(p)}" for p in request.startup_source)
                    r = await session.run(f"{{\n{script}\n}} 2>&1", timeout_s=max(request.startup_timeout, 0.001))
                    if r.timed_out:
                        raise CommandTimeoutError(f"timeout after {request.startup_timeout} seconds while "
                                                  f"sourcing {request.startup_source}")
                    output = r.stdout
            except BaseException:
                self._sessions.pop(request.session, None)
                await session.close()
                raise
        return CreateBashSessionResponse(output=output)

    def _session(self, name: str) -> Session:
        s = self._sessions.get(name)
        if s is None:
            raise SessionDoesNotExistError(f"session {name!r} does not exist")
        return s

    async def run_in_session(self, action: BashAction | BashInterruptAction) -> BashObservation:
        session = self._session(action.session)
        if isinstance(action, BashInterruptAction):
            if action.session in self._terminals:
                return await self._interrupt_terminal(action)
            async with self._guard(f"interrupt of session {action.session!r}"):
                await session.interrupt()
            return BashObservation(output="", exit_code=0, expect_string=PS1)
        if action.is_interactive_command or action.is_interactive_quit:
            return await self._interactive(action, session)
        timeout = NO_TIMEOUT_S if action.timeout is None else action.timeout
        nonce = secrets.token_hex(8)
        async with self._guard(f"run_in_session({action.session!r})"):
            r = await session.run(_session_script(action.command, session.shell or "/bin/sh", nonce),
                                  timeout_s=max(timeout, 0.001), binary=True)
        out = r.stdout_raw.decode(errors="backslashreplace")  # type: ignore[attr-defined]
        err = r.stderr_raw.decode(errors="backslashreplace")  # type: ignore[attr-defined]
        bad = re.fullmatch(rf"{_SYNTAX_MARK} {nonce} (\d+)\n", out)
        if bad:
            # SWE-ReX's own message and extra_info (its _check_bash_command), the shell
            # named as `bash -n` names itself there ("bash: line 2: ...", not a path)
            shell = session.shell or "/bin/sh"
            detail = re.sub(rf"^{re.escape(shell)}: ", f"{shell.rsplit('/', 1)[-1]}: ", err, flags=re.M)
            raise BashIncorrectSyntaxError(
                f"Error (exit code {bad.group(1)}) while checking bash command \n{action.command!r}\n"
                f"---- Stderr ----\n{detail}\n---- Stdout ----\n",
                extra_info={"bash_stdout": "", "bash_stderr": detail})
        output = out + err
        if r.timed_out:
            raise CommandTimeoutError(f"timeout after {action.timeout} seconds while running command "
                                      f"{action.command!r}")
        if action.check == "ignore":
            return BashObservation(output=output, exit_code=None, expect_string=PS1)
        if action.check == "raise" and r.exit_code != 0:
            msg = (f"Command {action.command!r} failed with exit code {r.exit_code}. Here is the output:\n"
                   f"{output!r}")
            raise NonZeroExitCodeError(f"{action.error_msg}: {msg}" if action.error_msg else msg)
        return BashObservation(output=output, exit_code=r.exit_code, expect_string=PS1)

    async def close_session(self, request: Any) -> CloseBashSessionResponse:
        session = self._session(request.session)
        del self._sessions[request.session]
        async with self._guard(f"close_session({request.session!r})"):
            await self._close_terminal(request.session)
            await session.close()
        return CloseBashSessionResponse()

    # ---- interactive programs (a terminal per session) ---------------------------------
    async def _interactive(self, action: BashAction, session: Session) -> BashObservation:
        timeout = NO_TIMEOUT_S if action.timeout is None else action.timeout
        async with self._guard(f"interactive command in session {action.session!r}"):
            term = self._terminals.get(action.session)
            if term is None or term.closed:
                term = await self._open_terminal(action.session, session)
            await term.sendline(action.command)
            got = await term.expect([*action.expect, re.escape(PS1)], max(timeout, 0.001))
            if got.timed_out:
                raise CommandTimeoutError(f"timeout after {action.timeout} seconds while running command "
                                          f"{action.command!r}")
            if action.is_interactive_quit or got.index == len(action.expect):   # back at the shell
                await self._close_terminal(action.session)
        output = got.before
        if not action.is_interactive_quit:   # a program that echoes what it reads (readline)
            output = output.lstrip().removeprefix(action.command).strip()
        assert got.index is not None
        return BashObservation(output=output, exit_code=0,
                               expect_string=[*action.expect, PS1][got.index])

    async def _open_terminal(self, name: str, session: Session) -> Terminal:
        """A terminal with the session's cwd and exported environment."""
        r = await session.run("pwd; env -0", timeout_s=30, binary=True)
        cwd, _, env_raw = r.stdout_raw.partition(b"\n")  # type: ignore[attr-defined]
        env = {}
        for item in env_raw.split(b"\0") if r.ok else ():
            k, sep, v = item.decode(errors="surrogateescape").partition("=")
            if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and k not in _SHELL_OWN:
                env[k] = v
        path = cwd.decode(errors="surrogateescape")
        term = await self.sandbox.terminal(shell=session.shell, cwd=path if path.startswith("/") else None,
                                           env=env, prompt=PS1)
        self._terminals[name] = term
        return term

    async def _close_terminal(self, name: str) -> None:
        term = self._terminals.pop(name, None)
        if term is not None:
            await term.close()

    async def _interrupt_terminal(self, action: BashInterruptAction) -> BashObservation:
        term = self._terminals[action.session]
        output = ""
        async with self._guard(f"interrupt of session {action.session!r}"):
            for _ in range(max(1, action.n_retry)):
                await term.interrupt()
                got = await term.expect([*action.expect, re.escape(PS1)], max(action.timeout, 0.001))
                if not got.timed_out:
                    assert got.index is not None
                    if got.index == len(action.expect):
                        await self._close_terminal(action.session)
                    return BashObservation(output=(output + got.before).strip(), exit_code=0,
                                           expect_string=[*action.expect, PS1][got.index])
            await self._close_terminal(action.session)   # what would not stop ends with its terminal
        raise CommandTimeoutError(f"failed to interrupt the interactive program of session {action.session!r}: "
                                  "its terminal was closed")

    # ---- commands and files -------------------------------------------------------------
    async def execute(self, command: Command) -> CommandResponse:
        """``subprocess.run`` semantics in a fresh ``/bin/sh`` of the sandbox."""
        timeout = max(NO_TIMEOUT_S if command.timeout is None else command.timeout, 0.001)
        script = _command_script(command)
        async with self._guard("execute"):
            r = await self._execute(script, timeout, command.cwd)
        if r.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
        resp = CommandResponse(stdout=r.stdout_raw.decode(errors="backslashreplace"),
                               stderr=r.stderr_raw.decode(errors="backslashreplace"),
                               exit_code=r.exit_code)
        if command.check and r.exit_code != 0:
            msg = (f"Command {command.command!r} failed with exit code {r.exit_code}. "
                   f"Stdout:\n{resp.stdout!r}\nStderr:\n{resp.stderr!r}")
            raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg else msg)
        return resp

    async def _execute(self, script: str, timeout: float, cwd: str | None) -> Any:
        """On an idle held ``/bin/sh`` session, in a subshell (a fork, not a new channel:
        about half of what ``sandbox.exec``'s fresh session costs), else with
        ``sandbox.exec``.  A runtime that executes more than once keeps such shells."""
        self._executes += 1
        shell = self._exec_idle.pop() if self._exec_idle else None
        if shell is None:
            if self._executes > 1:
                self._warm_exec_shell()
            return await self.sandbox.exec(script, timeout_s=timeout, cwd=cwd, binary=True)
        workdir = shlex.quote(cwd or self.sandbox.spec.workdir)
        try:
            r = await shell.run(f"(\ncd -- {workdir} || exit 126\n{script}\n)", timeout_s=timeout, binary=True)
        except BaseException:
            await asyncio.shield(shell.close())
            raise
        if len(self._exec_idle) < _EXEC_SHELLS and not shell.closed:
            self._exec_idle.append(shell)
        else:
            await shell.close()
        return r

    def _warm_exec_shell(self) -> None:
        if self._warming is not None and not self._warming.done():
            return

        async def warm() -> None:
            shell = self.sandbox.session(f"swerex-execute-{next(self._exec_ids)}", shell="/bin/sh")
            try:
                await shell.run(":", timeout_s=60)
            except FlowMeshError as exc:   # the next execute uses sandbox.exec
                self.logger.debug("%s: no execute shell: %s", self.sandbox.name, exc)
                await shell.close()
                return
            self._exec_idle.append(shell)

        self._warming = asyncio.ensure_future(warm())

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        async with self._guard(f"read_file({request.path!r})"):
            try:
                data = await self.sandbox.read_file(request.path)
            except SandboxFileError as exc:
                raise _os_error(str(exc), request.path) from exc
        return ReadFileResponse(content=data.decode(request.encoding or "utf-8", request.errors or "strict"))

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        async with self._guard(f"write_file({request.path!r})"):
            try:
                await self.sandbox.write_file(request.path, request.content)
            except SandboxFileError as exc:
                raise _os_error(str(exc), request.path) from exc
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """A local directory is copied to ``target_path`` (its contents, as
        ``shutil.copytree``); a file is written there with its mode."""
        src = request.source_path
        if not os.path.exists(src):
            raise FileNotFoundError(f"upload: {src} does not exist")
        async with self._guard(f"upload({src!r})"):
            try:
                if os.path.isdir(src):
                    await self.sandbox.upload(src, request.target_path)
                else:
                    with open(src, "rb") as fh:
                        data = fh.read()
                    await self.sandbox.write_file(request.target_path, data, mode=os.stat(src).st_mode & 0o7777)
            except SandboxFileError as exc:
                raise _os_error(str(exc), request.target_path) from exc
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """Close every session (the sandbox itself is the deployment's to stop)."""
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(BaseException):
                await self._warming
        sessions, self._sessions = list(self._sessions.values()), {}
        sessions += self._exec_idle
        self._exec_idle = []
        for s in sessions:
            with contextlib.suppress(FlowMeshError):
                await s.close()
        return CloseResponse()


class FlowMeshDeployment(AbstractDeployment):
    """A SWE-ReX deployment whose runtime is a sandbox of a FlowMesh pool.

    ``pool`` is a pool of a :class:`~flowmesh_sdk.Fleet` (persistent pools hand out warm
    containers); give ``spec`` (a :class:`~flowmesh_sdk.SandboxSpec`) or ``image`` (the
    pool's ``default_sandbox(image)``).  ``start()`` takes a sandbox, ``stop()`` closes
    the runtime's sessions and destroys the sandbox (idempotent)."""

    def __init__(self, pool: Any, *, image: str | None = None, spec: SandboxSpec | None = None,
                 tenant: str = "default", name: str = "swerex", logger: logging.Logger | None = None) -> None:
        if not callable(getattr(pool, "sandbox", None)):
            raise SpecError("pool", f"must be a FlowMesh pool (fleet.pool(...)), got {type(pool).__name__}")
        if (image is None) == (spec is None):
            raise SpecError("image", "give exactly one of image= or spec=")
        self.pool = pool
        self.spec = spec
        self.image = image
        self.tenant = tenant
        self.name = name
        self.logger = logger or log
        self._hooks = CombinedDeploymentHook()
        self._stack: contextlib.AsyncExitStack | None = None
        self._runtime: FlowMeshRuntime | None = None

    def __repr__(self) -> str:
        return f"FlowMeshDeployment(pool={getattr(self.pool, 'name', '?')}, image={self.image or self.spec.image})"  # type: ignore[union-attr]

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    @property
    def sandbox(self) -> Sandbox:
        return self.runtime.sandbox

    async def start(self, *args: Any, **kwargs: Any) -> None:
        if self._runtime is not None:
            return
        self._hooks.on_custom_step("Taking a FlowMesh sandbox")
        stack = contextlib.AsyncExitStack()
        try:
            cm = (self.pool.sandbox(self.spec, tenant=self.tenant, name=self.name) if self.spec is not None
                  else self.pool.sandbox(image=self.image, tenant=self.tenant, name=self.name))
            sb = await stack.enter_async_context(cm)
        except FlowMeshError as exc:
            await stack.aclose()
            raise SwerexException(f"could not start a FlowMesh sandbox: {exc}") from exc
        self._stack = stack
        self._runtime = FlowMeshRuntime(sb, logger=self.logger)
        self.logger.info("started %s in pool %s", sb.name, getattr(self.pool, "name", "?"))

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        runtime, self._runtime = self._runtime, None
        stack, self._stack = self._stack, None
        if runtime is not None:
            await runtime.close()
        if stack is not None:
            with contextlib.suppress(FlowMeshError):   # a lost sandbox is gone already
                await stack.aclose()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return await self._runtime.is_alive(timeout=timeout)

    @property
    def runtime(self) -> FlowMeshRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    def __del__(self) -> None:
        # AbstractDeployment.__del__ schedules stop() on whatever loop is current; a
        # sandbox belongs to its own loop, so only warn about one left open.
        if getattr(self, "_runtime", None) is not None:
            log.warning("FlowMeshDeployment garbage-collected without stop(); its sandbox is "
                        "destroyed when its pool drains")


def _session_script(command: str, shell: str, nonce: str) -> str:
    """``command`` as a session runs it: checked first with the session shell's ``-n`` on
    the text as SWE-ReX checks it (``bash -n`` reading ``COMMAND\\n``, so its messages and
    line numbers are SWE-ReX's), then, only if that passed, run with ``eval`` in the session
    shell itself, so ``cd``, variables, functions and ``source`` persist as typed at a
    prompt.  ``eval`` rather than a wrapping ``{ ...; }``: the text needs no wrapper around
    it (an empty or comment-only command is no syntax error, a trailing backslash or an
    unterminated here-document swallows no brace) and the error a model sees is about its
    own command; the check, not a wrapper parsed whole, is why nothing of a command that
    does not parse runs.  Stderr is merged into stdout.  A command that does not parse
    answers ``__FM_SYNTAX__ NONCE STATUS`` on stdout and the check's message on stderr,
    and returns 0.  Under ``set -e`` neither a failed check (an ``||`` list) nor that
    return ends the shell; under ``set -x`` the group's stderr on /dev/null (fd 3 its way
    out) shows none of the check."""
    return (f"{{ __fm_cmd={shlex.quote(command)}\n"
            "__fm_rc=0\n"
            f"__fm_syn=$(command {shlex.quote(shell)} -n 2>&1 >/dev/null <<__FM_EOF__\n"
            "$__fm_cmd\n"
            "__FM_EOF__\n"
            ") || __fm_rc=$?\n"
            'if [ "$__fm_rc" != 0 ]; then\n'
            """  printf '%s\\n' "$__fm_syn" >&3\n"""
            f"""  printf '{_SYNTAX_MARK} {nonce} %s\\n' "$__fm_rc"\n"""
            "  return 0\n"
            "fi\n"
            "unset __fm_syn __fm_rc\n"
            "} 3>&2 2>/dev/null\n"
            'eval "$__fm_cmd" 2>&1')


def _command_script(command: Command) -> str:
    """``subprocess.run(command.command, shell=..., env=...)`` as a /bin/sh script."""
    cmd = command.command
    if command.shell:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else ["/bin/sh", "-c", *cmd]
    else:
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
    if not argv or not argv[0]:
        raise SpecError("command.command", "must name a program (an empty command was given)")
    if command.env is not None:   # subprocess: env replaces the environment
        argv = ["env", "-i", *(f"{k}={v}" for k, v in command.env.items()), *argv]
    head = "exec 2>&1\n" if command.merge_output_streams else ""
    return head + "exec " + shlex.join(argv)


def _os_error(message: str, path: str) -> OSError:
    """A failed file call as the OSError ``pathlib`` would raise (what SWE-ReX's local
    runtime raises and its remote runtime transfers)."""
    low = message.lower()
    cls: type[OSError] = (FileNotFoundError if "no such file" in low else
                          IsADirectoryError if "is a directory" in low else
                          PermissionError if "permission denied" in low else OSError)
    return cls(f"{path}: {message}")
