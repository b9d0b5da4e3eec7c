"""A sandbox: one container, spoken to over a held-open shell channel.

``podman exec`` costs ~200 ms per call; a round trip over a shell that is already
running inside the container costs a few milliseconds.  So each sandbox holds one
``exec -i CTR /bin/sh`` open and frames commands over it.  The agent (``_AGENT``) is a
loop of POSIX sh that reads one header line with the ``read`` builtin (which reads its
input a byte at a time, so nothing past the line is consumed), then the payloads
with ``dd``:

* the host sends ``__fm_run ID TIMEOUT CAP SCRIPT_LEN STDIN_LEN SCRIPT_LINES`` and a
  newline, then exactly SCRIPT_LEN bytes of script and STDIN_LEN bytes of standard input.
  A short script (SCRIPT_LINES > 0) is read line by line with ``read -r`` (no fork); a
  long one is copied with ``dd``.  No payload ever
  travels in an argv string, so any size works (argv strings stop at 128 KiB);
* the agent stores the payloads in files of its own (in 1 MiB ``dd`` chunks, so a full
  disk costs that command, never the framing: what could not be stored is drained; a
  short script goes to ``/dev/shm`` when that is a writable tmpfs, since making a file on
  the container's overlay costs 240-500 us on the development machines against ~30 us there),
  takes a fresh pair of output files for this command only (made ahead in stocks that
  grow from 2 to 32 pairs, so a sandbox that runs a few commands makes a few files, by a
  background job, which also removes the files of finished commands, so neither
  costs the round trip; a used stock is emptied and handed out again once ``/proc``
  shows no process holding any of its files: emptying a file costs ~20 us of the
  sandbox's CPU where making one costs the overlay's price above; each pair has a fifo
  made with it, a started process's standard input, so a stock some process still reads
  from is replaced too)
  and holds them open
  (``/proc/self/fd``), so a background job of an earlier command, or a command that
  deletes the agent's files, can reach neither this command's output nor the
  protocol;
* it runs the script in a fresh ``/bin/sh`` in a new session (``setsid``; on an x86-64
  kernel, once checked, the agent's own 230-byte launcher, ``_setsid.py``, at a tenth of
  ``setsid``'s cost), made ahead of the command: after each answer the agent starts the
  next command's shell (the *standby*), which waits on a fifo for its script's name, so
  the fork and the two execs are paid while the host reads the answer, not after the
  next command arrives (the standby runs the script in itself: ``$0`` is ``sh``; without
  ``mkfifo`` in the image each command's shell is started when it arrives); all under a
  watchdog which at the
  deadline SIGKILLs the session's process group and then every process whose session
  (or parent chain) leads back to the command, found through ``/proc``: this works
  under dash, busybox ash and bash alike.  With ``bash`` in the image the watchdog is
  one process per agent, timing each command with ``read -t`` (no process per command;
  one a command kills is started again); without it, each command has a watcher of its
  own (a subshell and a ``sleep``);
* it answers ``__FM__ ID RC TIMEDOUT OUTBYTES ERRBYTES`` followed by at most CAP bytes
  of each stream (``RC`` 125 with a message on stderr when the agent itself could not
  run the command, e.g. the disk is full).  A command without output is answered by
  ``printf`` alone; one with output, on an x86-64 kernel once checked, by the agent's own
  static framer (``_framer.py``: the sizes by fstat, the bytes by read and write, one
  exec), else by ``wc -c`` and one ``dd`` per stream (the framer is a fifth of their
  cost).  Sessions answer the same way.  A started process (``__fm_proc``, ``_stream.py``)
  is streamed by the same framer, which waits on the process's pidfd between looks at
  its files (``fr ID CAP PID``), else (no pidfd, as under gVisor) by the shell's looks
  with ``wc``, ``dd`` and ``sleep``.

Only POSIX sh, ``setsid`` (optional: without it a timeout kills the command's process
tree by parent links), ``mkfifo`` (optional), ``bash`` (optional), ``dd``, ``sleep``,
``wc``, ``head``, ``mkdir``, ``mv``, ``rm``, ``ls`` and ``grep`` are needed in the image
(``chmod`` for the launcher and the framer), so
busybox and Debian images both work.

Sessions (``session.py``) hold a shell whose state persists; processes (``process.py``)
stream; a terminal (``terminal.py``) is a shell on a pseudo-terminal, for programs that
want one.
"""

from ._common import COMMAND_CAP, DEFAULT_OUTPUT_CAP, BinaryExecResult, sh_quote, sh_quote_bytes
from .process import Process, ProcessStream
from .sandbox import AGENT_FAILED, EXEC_CHANNELS, FILE_CAP, ExecResult, Sandbox
from .session import Session
from .terminal import Expected, Terminal

__all__ = ["AGENT_FAILED", "COMMAND_CAP", "DEFAULT_OUTPUT_CAP", "EXEC_CHANNELS", "FILE_CAP",
           "BinaryExecResult", "ExecResult", "Expected", "Process", "ProcessStream", "Sandbox", "Session",
           "Terminal", "sh_quote", "sh_quote_bytes"]
