"""A shell on a pseudo-terminal of the sandbox, for interactive programs.

:meth:`Sandbox.terminal` opens one (``podman exec -i -t``): a REPL, ``gdb``, a pager or
anything else that wants a terminal runs there, driven the way ``pexpect`` drives one --
:meth:`Terminal.sendline`, then :meth:`Terminal.expect` a prompt.  Stdout and stderr are
one stream (a terminal has one), carriage returns and ANSI escapes are taken out of the
text :meth:`expect` returns.  A timeout leaves the program running and the terminal open:
:meth:`Terminal.interrupt` sends Ctrl-C through the terminal's line discipline, as a
keyboard would.
"""

from __future__ import annotations

import asyncio
import codecs
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from .. import clock
from ..errors import SandboxClosedError
from ..remote.runner import Channel
from ..specs import ExecResult, SandboxSpec
from ._common import sh_quote

# SIGINT to the process groups of the terminal shell's children that are not its own group
_INTERRUPT_JOBS = r"""
{ read -r __l < "/proc/$SHELL_PID/stat"; } 2>/dev/null || exit 0
set -- ${__l##*) }; __own=$3
for __f in /proc/[0-9]*/stat; do
  { read -r __l < "$__f"; } 2>/dev/null || continue
  set -- ${__l##*) }
  [ "$2" = "$SHELL_PID" ] && [ "$3" != "$__own" ] && kill -INT -"$3" 2>/dev/null
done
exit 0
"""
_ANSI = re.compile(r"\x1B[@-_][0-?]*[ -/]*[@-~]")
_READ = 1 << 16
_START_TIMEOUT_S = 30.0
COLUMNS, ROWS = 200, 50      # the terminal's size (a pager or an editor asks)


def clean(text: str) -> str:
    """Terminal output as text: ANSI escape sequences out, CR LF as LF."""
    return _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "")


@dataclass(frozen=True, slots=True)
class Expected:
    """What :meth:`Terminal.expect` saw: ``index`` of the pattern that matched first in
    the output (None: ``timed_out``), the text ``before`` it and the ``match``ed text."""

    index: int | None
    before: str
    match: str = ""
    timed_out: bool = False


class TerminalHost(Protocol):
    """What a :class:`Terminal` needs of its sandbox (a :class:`~flowmesh_sdk.sandbox.Sandbox`
    is one): named here, so that this module does not import the sandbox's."""

    name: str
    spec: SandboxSpec

    async def exec(self, cmd: str, *, timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None) -> ExecResult: ...

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None: ...


class Terminal:
    """A shell (bash where the image has it) on a pseudo-terminal in the sandbox, its echo
    off and its prompt :attr:`prompt`.  Made by :meth:`Sandbox.terminal`."""

    def __init__(self, sandbox: TerminalHost, chan: Channel, prompt: str) -> None:
        self.sandbox = sandbox
        self.prompt = prompt
        self.shell_pid = 0          # the terminal's shell, in the sandbox (known once it is up)
        self._chan = chan
        self._buf = ""
        # UTF-8 across reads (a character may be split between two), bad bytes escaped
        self._dec = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        self._closed = False

    def __repr__(self) -> str:
        return f"Terminal({self.sandbox.name}, prompt={self.prompt!r}, closed={self._closed})"

    @property
    def closed(self) -> bool:
        return self._closed or not self._chan.alive

    async def send(self, data: str | bytes) -> None:
        """``data`` as typed, no newline added."""
        if self.closed:
            raise SandboxClosedError(f"{self.sandbox.name}: the terminal is closed")
        await self._chan.write(data.encode() if isinstance(data, str) else data)

    async def sendline(self, line: str) -> None:
        await self.send(line + "\n")

    async def interrupt(self) -> None:
        """Ctrl-C: SIGINT to the terminal's foreground process group.  Under gVisor, whose
        terminal takes Ctrl-C as a plain byte, the shell's jobs' process groups are sent
        SIGINT instead (what the shell runs is in a group of its own under job control)."""
        if self.sandbox.spec.kernel != "gvisor":
            await self.send(b"\x03")
            return
        if self.closed:
            raise SandboxClosedError(f"{self.sandbox.name}: the terminal is closed")
        await self.sandbox.exec(_INTERRUPT_JOBS, env={"SHELL_PID": str(self.shell_pid)}, timeout_s=30)

    async def expect(self, patterns: Sequence[str], timeout_s: float) -> Expected:
        """Read until one of ``patterns`` (regular expressions, as ``pexpect`` takes them)
        matches the output; the earliest match wins.  What came before it is returned and
        taken from the buffer with the match; on a timeout nothing is taken (a later
        ``expect`` sees it again)."""
        compiled = [re.compile(p) for p in patterns]
        deadline = clock.monotonic() + timeout_s
        while True:
            found = [(m.start(), i, m) for i, rx in enumerate(compiled) if (m := rx.search(self._buf))]
            if found:
                _, i, m = min(found, key=lambda f: (f[0], f[1]))
                before, self._buf = self._buf[:m.start()], self._buf[m.end():]
                return Expected(i, before, m.group(0))
            left = deadline - clock.monotonic()
            if left <= 0:
                return Expected(None, self._buf, timed_out=True)
            try:
                data = await asyncio.wait_for(self._chan.read(_READ), left)
            except asyncio.TimeoutError:
                continue
            if not data:
                self._closed = True
                said = self._buf.strip()[-300:]
                raise SandboxClosedError(f"{self.sandbox.name}: the terminal ended: "
                                         f"{said + ' | ' if said else ''}{await self._chan.last_words()}")
            self._buf += clean(self._dec.decode(data))

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._chan.close()


async def open_terminal(sandbox: TerminalHost, chan: Channel, *, cwd: str | None, env: Mapping[str, str],
                        prompt: str | None) -> Terminal:
    """A :class:`Terminal` on ``chan`` (a shell on a pseudo-terminal), in ``cwd`` with ``env``
    exported, once its prompt is up."""
    prompt = prompt or f"__FM_PROMPT_{secrets.token_hex(4)}__"
    term = Terminal(sandbox, chan, prompt)
    ready = f"__FM_READY_{secrets.token_hex(6)}__"
    # the setup goes in a file the shell sources: a terminal's line is at most 4095 bytes,
    # and what is typed before `stty -echo` holds is echoed (the environment's values too)
    script = f"/tmp/.flowmesh-terminal-{secrets.token_hex(6)}.sh"
    setup = [f"rm -f -- {sh_quote(script)}", f"stty -echo cols {COLUMNS} rows {ROWS} 2>/dev/null",
             f"PS1={sh_quote(prompt)}", "PS2=", "PS0=", "export PS1 PS2 PS0", "unset PROMPT_COMMAND",
             f"cd -- {sh_quote(cwd or sandbox.spec.workdir)}"]
    setup += [f"export {k}={sh_quote(v, 'terminal.env')}" for k, v in env.items()]
    setup.append(f"printf '%s %s\\n' {ready} \"$$\"")   # ready, and the shell's pid
    try:
        await sandbox.write_file(script, "\n".join(setup) + "\n", mode=0o600)
        await term.sendline(f". {sh_quote(script)}")
        got = await term.expect([re.escape(ready) + r" ([0-9]+)\n"], _START_TIMEOUT_S)
        if got.timed_out:
            raise SandboxClosedError(f"{sandbox.name}: the terminal's shell did not start: {got.before[-300:]!r}")
        term.shell_pid = int(got.match.split()[-1])
        got = await term.expect([re.escape(prompt)], _START_TIMEOUT_S)
        if got.timed_out:
            raise SandboxClosedError(f"{sandbox.name}: the terminal's shell showed no prompt: {got.before[-300:]!r}")
    except BaseException:
        await term.close()
        raise
    return term
