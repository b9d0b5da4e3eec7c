"""Shell sessions: one long-lived interactive shell per session, on a channel of its own.

The session's shell is started interactive (``SHELL -i``, its own stdout and stderr on
/dev/null), so that SIGINT aborts what it is running, a loop of builtins included, and
throws it back to its top level instead of ending it.  Every command is framed like an
``exec`` (``__fm_srun ID CAP SCRIPT_LEN SCRIPT_LINES``, then the script, then the line
``__fm_sloop``), stored in a file and run with ``.`` inside the shell itself, so ``cd``,
variables, functions and ``source venv/bin/activate`` persist; its output goes to a
fresh pair of files.  The shell answers ``__FMS__ ID LASTPID`` when the command starts and
``__FM__ ID RC FLAG OUTBYTES ERRBYTES`` plus the output when it ends; FLAG is 2 when the
command ended the shell (``exit``, errexit): its EXIT trap answers the command, and the
host drops that shell so that the next command starts a fresh one.

Timeouts and :meth:`Session.interrupt` are driven by the host over another of the
sandbox's channels (``SIGNAL_TREE``): SIGINT (or SIGKILL) to the processes the command
started (those started before it, e.g. an earlier command's background server, are left
alone) and SIGINT to the shell; a shell thrown back to its top level reads the
``__fm_sloop`` line that follows every command, answers the aborted command and goes on
serving.  If nothing comes back the session's shell is killed and the next command
starts a fresh one (its state is then gone: ``Session.restarts`` counts these).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from .. import clock, timers
from ..errors import SandboxClosedError, SandboxFileError, SpecError
from ..specs import ExecResult, SandboxSpec, check_number
from ._agent import SESSION
from ._common import (DEFAULT_OUTPUT_CAP, _check_command, _env_prefix, _frame_head, _read_exactly,
                      _read_line, _result, sh_quote)

if TYPE_CHECKING:
    from ..remote.runner import Channel

_HEADER = re.compile(rb"^__FM__ (\d+) (-?\d+) ([012]) (\d+) (\d+)\n$")
_EXITING = b"2"                # the header's flag: the shell is ending (`exit` in the command)
_STARTED = re.compile(rb"^__FMS__ (\d+) (\d+)\n$")
_START_S = 30.0
_INT_GRACE_S = 2.0          # after SIGINT, before SIGKILL
_KILL_GRACE_S = 3.0         # after SIGKILL, before the shell itself is killed
_BODY_S = 60.0
_LOST = b"flowmesh: the session's shell did not come back; it was restarted\n"


class _Running:
    __slots__ = ("ident", "since", "started", "done", "timed_out", "interrupted", "shell_sent")

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.since = 0
        self.started = asyncio.Event()
        self.done = asyncio.Event()
        self.timed_out = False
        self.interrupted = False
        self.shell_sent = False     # the shell has had its one SIGINT (see Session._signal)


class SessionHost(Protocol):
    """What a :class:`Session` needs of its sandbox (a :class:`~flowmesh_sdk.sandbox.Sandbox`
    is one): named here, so that this module does not import the sandbox's."""

    name: str
    spec: SandboxSpec
    _sessions: dict[str, Session]

    @property
    def closed(self) -> bool: ...

    async def _open_shell(self) -> Channel: ...

    async def _kill_agent(self, pid: int) -> None: ...

    async def _signal_tree(self, shell_pid: int, since_cs: int, tree_sig: int,
                           shell_sig: int | None) -> None: ...


class Session:
    """A named shell in a sandbox (see :meth:`Sandbox.session`).  Commands run one at a
    time per session; sessions of one sandbox run side by side."""

    def __init__(self, sandbox: SessionHost, name: str, shell: str | None,
                 env: Mapping[str, str], cwd: str | None) -> None:
        self.sandbox = sandbox
        self.name = name
        self.shell_arg = shell
        self.env = env
        self.cwd = cwd
        self.shell: str | None = None     # the shell in use, once started
        self.pid = 0                      # its pid in the sandbox
        self.restarts = 0                 # fresh shells after the first (state lost)
        self._chan: Channel | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._running: _Running | None = None
        self._closed = False
        self._started_once = False

    def __repr__(self) -> str:
        return f"Session({self.name!r}, shell={self.shell or self.shell_arg}, sandbox={self.sandbox.name})"

    async def __aenter__(self) -> Session:
        async with self._lock:
            await self._ensure()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def running(self) -> bool:
        """True while a command of this session runs (it has started in the shell)."""
        cur = self._running
        return cur is not None and cur.started.is_set() and not cur.done.is_set()

    @property
    def closed(self) -> bool:
        return self._closed or self.sandbox.closed

    # ---- lifecycle -------------------------------------------------------------------
    async def _ensure(self) -> Channel:
        if self.closed:
            raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r} is closed")
        if self._chan is not None and self._chan.alive:
            return self._chan
        if self._chan is not None:
            await self._drop(kill=True)
        chan = await self.sandbox._open_shell()
        try:
            await self._boot(chan)
        except BaseException:
            await chan.close()
            raise
        self._chan = chan
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        setup = b""
        cwd = self.cwd or self.sandbox.spec.workdir
        setup += f"cd {sh_quote(cwd, 'cwd')} || return 126\n".encode()
        setup += (_env_prefix(self.sandbox.spec.env) + _env_prefix(self.env)).encode() + b"\n"
        res = await self._run_locked(setup, 60.0, 65536, False)
        if res.exit_code != 0 or self._chan is not chan:     # (not chan: the shell ended)
            await self._drop(kill=True)
            raise SandboxFileError(f"{self.sandbox.name}: session {self.name!r} could not start in "
                                   f"{cwd}: {res.stderr.strip()}")
        return chan

    async def _boot(self, chan: Channel) -> None:
        want = sh_quote(self.shell_arg, "session.shell") if self.shell_arg else "''"
        boot = (f"__fm_sh={want}; if [ -z \"$__fm_sh\" ]; then __fm_sh=$(command -v bash 2>/dev/null); "
                "[ -n \"$__fm_sh\" ] || __fm_sh=/bin/sh; fi; "
                "if [ -x \"$__fm_sh\" ]; then echo \"__FM_BOOT__ $__fm_sh\"; "
                "exec \"$__fm_sh\" -i 7>&1 >/dev/null 2>&1; "
                "else echo \"__FM_NOSHELL__ $__fm_sh\"; exit 0; fi\n")
        await chan.write(boot.encode())
        deadline = clock.monotonic() + _START_S
        try:
            while True:
                line = await _read_line(chan, deadline)
                if not line:
                    raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r}: the "
                                             f"shell did not start: {chan.stderr_tail()}")
                if line.startswith(b"__FM_NOSHELL__"):
                    raise SpecError("session.shell", f"{line.split(b' ', 1)[1].decode().strip()!r} "
                                                     "is not an executable in the image")
                if line.startswith(b"__FM_BOOT__"):
                    self.shell = line.split(b" ", 1)[1].decode("utf-8", "replace").strip()
                    break
            # the shell reads this only now (nothing else was sent after the boot line)
            await chan.write(SESSION.encode())
            while True:
                line = await _read_line(chan, deadline)
                if not line:
                    raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r}: "
                                             f"{self.shell} did not run the session program: "
                                             f"{chan.stderr_tail()}")
                if line.startswith(b"__FM_SREADY__"):
                    self.pid = int(line.split()[1])
                    return
        except asyncio.TimeoutError as exc:
            raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r} did not start "
                                     f"within {_START_S:g} s: {chan.stderr_tail()}") from exc

    async def _drop(self, *, kill: bool = False) -> None:
        chan, self._chan = self._chan, None
        if chan is not None:
            await chan.close()
            if kill and self.pid and not self.sandbox.closed:
                await self.sandbox._kill_agent(self.pid)
        self.pid = 0

    async def close(self) -> None:
        """End the session's shell and everything it started (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.sandbox._sessions.get(self.name) is self:
            del self.sandbox._sessions[self.name]
        await self._drop(kill=True)

    # ---- commands --------------------------------------------------------------------
    async def run(self, cmd: str, *, timeout_s: float | None = None,
                  output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False) -> ExecResult:
        """Run ``cmd`` in the session's shell; what it changes (cwd, variables, functions,
        an activated venv) stays for the next command.  The result is what ``exec``
        gives; past ``timeout_s`` (default ``spec.timeout_s``) the processes the command
        started are killed, the shell is thrown back to its prompt and ``timed_out`` is
        set; the session goes on."""
        timeout = self.sandbox.spec.timeout_s if timeout_s is None else timeout_s
        check_number("timeout_s", timeout, lo=0, hi=7 * 86400, lo_open=True)
        check_number("output_cap", output_cap, lo=0, integer=True)
        script = _check_command(cmd) + b"\n"
        async with self._lock:
            await self._ensure()
            return await self._run_locked(script, timeout, output_cap, binary)

    async def _run_locked(self, script: bytes, timeout: float, cap: int, binary: bool) -> ExecResult:
        chan = self._chan
        assert chan is not None
        ident = next(self._ids)
        cur = _Running(ident)
        self._running = cur
        t0 = clock.monotonic()
        try:
            await chan.write(_frame_head("__fm_srun", ident, "", cap, script, None)
                             + script + b"__fm_sloop\n")
            deadline = t0 + timeout
            stage = 0
            while True:
                try:
                    raw = await _read_line(chan, deadline)
                except asyncio.TimeoutError:
                    cur.timed_out = cur.timed_out or stage == 0
                    stage += 1
                    if stage > 2:
                        await self._drop(kill=True)
                        return _result(137, cur.timed_out, b"", _LOST, 0, 0,
                                       clock.monotonic() - t0, binary)
                    sig = signal.SIGKILL if (cur.timed_out or stage == 2) else signal.SIGINT
                    await self._signal(cur, sig)
                    deadline = clock.monotonic() + (_KILL_GRACE_S if stage == 2 else _INT_GRACE_S)
                    continue
                if not raw:
                    await self._drop(kill=True)
                    if cur.interrupted and cur.shell_sent:     # interrupt() gave up on it
                        return _result(130, cur.timed_out, b"", _LOST, 0, 0,
                                       clock.monotonic() - t0, binary)
                    raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r}: the shell "
                                             f"ended (state lost; the next command starts a fresh one): "
                                             f"{chan.stderr_tail()}")
                m = _STARTED.match(raw)
                if m and int(m.group(1)) == ident:
                    cur.since = int(m.group(2))
                    cur.started.set()
                    continue
                m = _HEADER.match(raw)
                if m and int(m.group(1)) == ident:
                    break
            rc, osz, esz = int(m.group(2)), int(m.group(4)), int(m.group(5))
            body_deadline = clock.monotonic() + _BODY_S
            out = await _read_exactly(chan, min(osz, cap), body_deadline)
            err = await _read_exactly(chan, min(esz, cap), body_deadline)
            if m.group(3) == _EXITING:
                # the shell is ending: what it started goes with it, the next run starts a fresh one
                await self._drop(kill=True)
            return _result(rc, cur.timed_out, out, err, osz, esz, clock.monotonic() - t0, binary)
        except asyncio.TimeoutError as exc:
            await self._drop(kill=True)
            raise SandboxClosedError(f"{self.sandbox.name}: session {self.name!r}: the output did "
                                     "not arrive (the shell was restarted)") from exc
        except asyncio.CancelledError:
            # the caller gave up: the channel's state is unknown, so this shell goes
            await asyncio.shield(self._drop(kill=True))
            raise
        finally:
            cur.done.set()
            if self._running is cur:
                self._running = None

    async def _signal(self, cur: _Running, sig: int) -> None:
        if not cur.started.is_set():
            try:
                async with timers.timeout(_START_S):
                    await cur.started.wait()
            except TimeoutError:
                return
        if self.pid and not cur.done.is_set():
            # The shell gets one SIGINT per command, never a second: one throws it back to
            # its top level, where it reads the __fm_sloop sent after the command and
            # answers; a second one landing while it does that (the host's next stage, when
            # the first took longer than the grace) can catch busybox ash inside libc with a
            # lock held -- its SIGINT handler longjmps out -- and the shell hangs on that
            # lock for good (seen: /proc/PID/wchan futex_do_wait, the session lost).  Later
            # stages SIGKILL what the command started; a shell still not back is dropped.
            shell_sig = None if cur.shell_sent else int(signal.SIGINT)
            cur.shell_sent = True
            await self.sandbox._signal_tree(self.pid, cur.since, int(sig), shell_sig)

    async def interrupt(self) -> None:
        """Interrupt the running command as Ctrl-C would: SIGINT to what it started and to
        the shell (a loop of builtins stops too), then SIGKILL to what it started if it is
        not back within 2 s, then a fresh shell.  Returns once the command has ended; the
        session goes on (its run() returns the command's result, normally exit code 130)."""
        cur = self._running
        if cur is None or cur.done.is_set():
            return
        cur.interrupted = True
        for sig, grace in ((signal.SIGINT, _INT_GRACE_S), (signal.SIGKILL, _KILL_GRACE_S)):
            await self._signal(cur, sig)
            try:
                async with timers.timeout(grace):
                    await cur.done.wait()
                return
            except TimeoutError:
                continue
        await self._drop(kill=True)
        await cur.done.wait()
