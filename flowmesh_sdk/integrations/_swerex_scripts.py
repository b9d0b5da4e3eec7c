"""How :class:`~._swerex_runtime.FlowMeshRuntime` translates SWE-ReX's requests: a
session's command into the script its shell runs (syntax check first, then ``eval``), a
``Command`` into the ``/bin/sh`` script ``subprocess.run`` would amount to, and a failed
file call into the ``OSError`` SWE-ReX's runtimes raise.  No I/O, no swe-rex import."""

from __future__ import annotations

import errno
import os
import shlex
from typing import TYPE_CHECKING

from ..errors import SpecError
from ._shell import cwd_errno

if TYPE_CHECKING:
    from swerex.runtime.abstract import Command

_SYNTAX_MARK = "__FM_SYNTAX__"   # + a nonce and the check's status: stdout of a command that did not parse


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


_EXEC_MARK = "__FM_EXEC__"   # + a nonce and a status (below): the script could not run its program
# the mark's statuses, as (what, errno): exec found no program | found one it could not run |
# ``command -v`` found none on the path | the cwd could not be entered (the last two: errno None,
# :func:`_why_script` finds it)
_EXEC_STATUS: dict[str, tuple[str, int | None]] = {
    "127": ("program", errno.ENOENT), "126": ("program", errno.EACCES), "3": ("program", None), "4": ("cwd", None)}
# what subprocess.run looks a program up in when ``env`` is given without PATH (os.defpath)
_DEFAULT_PATH = "/bin:/usr/bin"


def _command_script(command: Command, nonce: str) -> str:
    """``subprocess.run(command.command, shell=..., env=..., cwd=...)`` as a /bin/sh script.

    Where ``subprocess.run`` raises before the program runs -- its ``cwd`` cannot be entered,
    or its program is not found or cannot be run -- the script answers ``__FM_EXEC__ NONCE
    STATUS`` on stdout and exits 127 (:func:`_exec_failed`).  Kept short: a short script is
    read by the agent's shell a byte at a time.  The program is looked up with ``command
    -v``, or, when ``env`` is given, in its PATH entry by entry (``os.get_exec_path(env)``),
    and run with ``exec``: a found program's status is its own.  The EXIT trap runs only if
    the ``exec`` fails (dash and ash exit, bash with ``execfail`` goes on to ``exit``); a
    name that is only a builtin of the shell passes ``command -v`` and fails there."""
    cmd = command.command
    if command.shell:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else ["/bin/sh", "-c", *cmd]
    else:
        argv = [cmd] if isinstance(cmd, str) else list(cmd)
    if not argv or not argv[0]:
        raise SpecError("command.command", "must name a program (an empty command was given)")
    lines = [f"trap 'echo {_EXEC_MARK} {nonce} $?; exit 127' EXIT", "${BASH_VERSION+shopt -s execfail}"]
    if command.cwd is not None:
        lines.append(f"cd -- {shlex.quote(command.cwd)} 2>/dev/null || exit 4")
    name = shlex.quote(argv[0])
    if "/" not in argv[0] and command.env is None:
        lines.append(f"command -v -- {name} >/dev/null 2>&1 || exit 3")
    elif "/" not in argv[0] and command.env is not None:   # searched here: `env` answers 126 or 127 as a program may
        lines.append(f"__fm_s={shlex.quote(command.env.get('PATH', _DEFAULT_PATH))}; __fm_i=$IFS; IFS=:; "
                     f'for __fm_d in $__fm_s; do __fm_p=${{__fm_d:-.}}/{name}; [ -f "$__fm_p" ] && [ -x "$__fm_p" ] '
                     '&& break; __fm_p=; done; IFS=$__fm_i; [ -n "$__fm_p" ] || exit 3')
    if command.env is not None:   # subprocess: env replaces the environment
        argv = ["env", "-i", *(f"{k}={v}" for k, v in command.env.items()), *argv]
    if command.merge_output_streams:
        lines.append("exec 2>&1")
    lines += ["exec " + shlex.join(argv), "exit"]
    return "\n".join(lines)


def _exec_failed(stdout: str, nonce: str) -> tuple[str, int | None] | None:
    """What :func:`_command_script`'s mark says could not be done -- ``cwd`` or ``program``,
    and its errno where the mark says -- or None when the program ran."""
    head = f"{_EXEC_MARK} {nonce} "
    last = stdout.rstrip("\n").rpartition("\n")[2]   # the last line: the shell's message may come first (merged)
    return _EXEC_STATUS.get(last[len(head):], ("program", errno.ENOENT)) if last.startswith(head) else None


def _why_script(command: Command, what: str) -> str:
    """Why the cwd could not be entered or ``command -v`` found no program: a script that
    prints the errno ``subprocess`` would raise (a path's first executable file is the
    program; any other file or directory there means EACCES)."""
    if what == "cwd":
        return f'{cwd_errno(command.cwd or ".")}; echo "$__fm_e"'
    name = shlex.quote(_program(command))
    path = "$PATH" if command.env is None else shlex.quote(command.env.get("PATH", _DEFAULT_PATH))
    cd = f"cd -- {shlex.quote(command.cwd)} || exit\n" if command.cwd is not None else ""
    return (f"{cd}k={errno.ENOENT}; s={path}; IFS=:\n"
            f'for d in $s; do p=${{d:-.}}/{name}; [ -f "$p" ] && [ -x "$p" ] && exit; [ -e "$p" ] && k={errno.EACCES}; done\n'
            'echo "$k"')


def _program(command: Command) -> str:
    cmd = command.command
    return "/bin/sh" if command.shell else cmd if isinstance(cmd, str) else cmd[0]


def _exec_error(command: Command, what: str, err: int | str) -> OSError:
    """The OSError ``subprocess.run`` raises when ``what`` (``cwd`` or ``program``) failed with
    ``err`` (an errno, or :func:`_why_script`'s answer: ENOENT where it gave none)."""
    code = int(err) if str(err).isdigit() else errno.ENOENT
    return OSError(code, os.strerror(code), command.cwd if what == "cwd" else _program(command))   # its subclass


def _os_error(message: str, path: str) -> OSError:
    """A failed file call as the OSError ``pathlib`` would raise (what SWE-ReX's local
    runtime raises and its remote runtime transfers)."""
    low = message.lower()
    cls: type[OSError] = (FileNotFoundError if "no such file" in low else
                          IsADirectoryError if "is a directory" in low else
                          PermissionError if "permission denied" in low else OSError)
    return cls(f"{path}: {message}")
