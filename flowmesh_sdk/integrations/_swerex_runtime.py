"""The SWE-ReX runtime on one FlowMesh sandbox: :class:`FlowMeshRuntime` (SWE-ReX's
``AbstractRuntime``: sessions, interactive programs on a terminal, ``execute``, files) and
:class:`SandboxLostError`.  :mod:`flowmesh_sdk.integrations.swerex` re-exports both and
describes what each call does; :mod:`._swerex_scripts` turns requests into shell scripts."""

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
from typing import Any, cast

from . import require

require("swerex", package="swe-rex", extra="swerex")

from swerex.exceptions import (BashIncorrectSyntaxError, CommandTimeoutError,  # noqa: E402
                               NonZeroExitCodeError, SessionDoesNotExistError,
                               SessionExistsError, SwerexException)
from swerex.runtime.abstract import (AbstractRuntime, BashAction, BashInterruptAction,  # noqa: E402
                                     BashObservation, CloseBashSessionResponse, CloseResponse, Command,
                                     CommandResponse, CreateBashSessionRequest, CreateBashSessionResponse,
                                     IsAliveResponse, ReadFileRequest, ReadFileResponse, UploadRequest,
                                     UploadResponse, WriteFileRequest, WriteFileResponse)

from ..errors import (ContainerRuntimeError, FlowMeshError, InstanceLost, SandboxClosedError,  # noqa: E402
                      SandboxFileError, SandboxTimeout, SpecError)
from ..sandbox import BinaryExecResult, Sandbox, Session, Terminal  # noqa: E402
from ..pools.failures import lost_kind  # noqa: E402
from ..specs import InfraFailure  # noqa: E402
from ._swerex_scripts import (_SYNTAX_MARK, _command_script, _exec_error, _exec_failed,  # noqa: E402
                              _os_error, _session_script, _why_script)

__all__ = ["FlowMeshRuntime", "SandboxLostError", "NO_TIMEOUT_S", "PS1"]

log = logging.getLogger("flowmesh.integrations.swerex")

#: what ``timeout=None`` ("no timeout") becomes: the longest a FlowMesh command may run
NO_TIMEOUT_S = 7 * 86400.0
#: SWE-ReX's BashSession prompt: what a finished command's ``expect_string`` is
PS1 = "SHELLPS1PREFIX"
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
            # Session.run is typed ExecResult; with binary=True it is a BinaryExecResult
            r = cast(BinaryExecResult,
                     await session.run(_session_script(action.command, session.shell or "/bin/sh", nonce),
                                       timeout_s=max(timeout, 0.001), binary=True))
        out = r.stdout_raw.decode(errors="backslashreplace")
        err = r.stderr_raw.decode(errors="backslashreplace")
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
        # Session.run is typed ExecResult; with binary=True it is a BinaryExecResult
        r = cast(BinaryExecResult, await session.run("pwd; env -0", timeout_s=30, binary=True))
        cwd, _, env_raw = r.stdout_raw.partition(b"\n")
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
        nonce = secrets.token_hex(8)
        script = _command_script(command, nonce)
        async with self._guard("execute"):
            r = await self._execute(script, timeout)
        if r.timed_out:
            raise CommandTimeoutError(f"Timeout ({command.timeout}s) exceeded while running command")
        if r.exit_code == 127 and (failed := _exec_failed(r.stdout_raw.decode(errors="replace"), nonce)):
            what, err = failed   # its cwd or program: what subprocess.run raises, as SWE-ReX's runtime does
            why: int | str = err if err is not None else ""
            if err is None:
                async with self._guard("execute"):
                    why = (await self.sandbox.exec(_why_script(command, what), timeout_s=30)).stdout.strip()
            raise _exec_error(command, what, why)
        resp = CommandResponse(stdout=r.stdout_raw.decode(errors="backslashreplace"),
                               stderr=r.stderr_raw.decode(errors="backslashreplace"),
                               exit_code=r.exit_code)
        if command.check and r.exit_code != 0:
            msg = (f"Command {command.command!r} failed with exit code {r.exit_code}. "
                   f"Stdout:\n{resp.stdout!r}\nStderr:\n{resp.stderr!r}")
            raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg else msg)
        return resp

    async def _execute(self, script: str, timeout: float) -> Any:
        """On an idle held ``/bin/sh`` session, in a subshell (a fork, not a new channel:
        about half of what ``sandbox.exec``'s fresh session costs), else with
        ``sandbox.exec``.  A runtime that executes more than once keeps such shells."""
        self._executes += 1
        shell = self._exec_idle.pop() if self._exec_idle else None
        if shell is None:
            if self._executes > 1:
                self._warm_exec_shell()
            return await self.sandbox.exec(script, timeout_s=timeout, binary=True)
        workdir = shlex.quote(self.sandbox.spec.workdir)   # the script enters the command's own cwd
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
