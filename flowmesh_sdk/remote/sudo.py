"""Commands as root through ``sudo``, for a login user that is not root.

The SSH runner (``SshTarget(sudo=True)``) runs *every* command through sudo: the
container runtime, the bootstrap's install, login and pull all need root, and a
runner only runs commands.  Passwordless sudo (``NOPASSWD``, the cloud images'
default) is ``sudo -n``: a machine that asks for a password fails at once instead of
hanging.  With a password, ``sudo -S`` prompts on stderr with the SDK's own prompt;
:class:`SudoGate` watches the command's stderr until it has started, answers the prompt
with invoke's ``FailingResponder`` (what ``fabric.Connection.sudo`` uses) and holds those
bytes back, so neither the prompt nor anything sudo says reaches the caller's stderr.  The
password is written to the channel only when sudo asks for it (never into a command line,
an environment, a log or a repr), and a refused password ("Sorry, try again.") ends the
command instead of being retried.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

PROMPT = "[flowmesh-sudo] password: "
_SENTINEL = r"Sorry, try again\."    # sudo's words for a wrong password (LC_ALL=C)


@dataclass(frozen=True, slots=True)
class Sudo:
    """How to become root on the machine: passwordless, or with ``password`` (hidden)."""

    password: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Sudo(password={'<hidden>' if self.password else None})"

    def prefix(self) -> str:
        """The words before the command: ``sudo`` that never prompts, or that prompts
        with the SDK's own prompt on stderr and reads the answer from stdin."""
        if self.password is None:
            return "sudo -n -H --"
        return f"env LC_ALL=C sudo -S -H -p {shlex.quote(PROMPT)} --"


class SudoGate:
    """The stderr of one ``sudo -S`` command until the command has started: prompts are
    answered (``send``), everything is held back; :meth:`release` hands on what came after
    the last prompt (the command's own first stderr bytes, if any raced ahead)."""

    def __init__(self, password: str, send: Callable[[bytes], None]) -> None:
        from invoke.watchers import FailingResponder   # fabric's dependency (the [ssh] extra)

        self._responder = FailingResponder(pattern=re.escape(PROMPT), response=password + "\n",
                                           sentinel=_SENTINEL)
        self._send = send
        self._buf = bytearray()
        self._open = False
        self._lock = threading.Lock()
        #: sudo said the password was wrong (the command never started)
        self.refused = False

    def __repr__(self) -> str:
        return f"SudoGate(open={self._open}, refused={self.refused})"

    def feed(self, data: bytes) -> bytes | None:
        """Called by the stderr reader: the bytes to pass on, or None while held."""
        from invoke.exceptions import ResponseNotAccepted

        with self._lock:
            if self._open:
                return data
            if self.refused:
                return None
            self._buf += data
            try:
                for answer in self._responder.submit(self._buf.decode("utf-8", "replace")):
                    self._send(answer.encode())
            except ResponseNotAccepted:
                self.refused = True
            return None

    def release(self) -> bytes:
        """The command has started: pass stderr through from now on; returns what was
        held after sudo's last prompt."""
        with self._lock:
            self._open = True
            held, self._buf = bytes(self._buf), bytearray()
        cut = held.rfind(PROMPT.encode())
        return held[cut + len(PROMPT):] if cut >= 0 else held
