"""How :class:`~._swerex_runtime.FlowMeshRuntime` translates SWE-ReX's requests: a
session's command into the script its shell runs (syntax check first, then ``eval``), a
``Command`` into the ``/bin/sh`` script ``subprocess.run`` would amount to, and a failed
file call into the ``OSError`` SWE-ReX's runtimes raise.  No I/O, no swe-rex import."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from ..errors import SpecError

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
