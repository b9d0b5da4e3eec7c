"""How this process waits for its children (the local runner's commands and channels).

Python 3.11's asyncio waits for each child with a thread of its own
(``ThreadedChildWatcher``), and the event loop waits for that thread to start: under load,
milliseconds of a blocked loop for every command, besides the thread.  Python 3.12 waits
through a pidfd in the event loop that started the child, where the kernel has
``pidfd_open`` (Linux 5.3).  :func:`pidfd_watcher` has 3.11 do the same, through
:class:`PidfdWatcher`; 3.11's own ``PidfdChildWatcher`` is bound to one loop, which a
program that runs loops one after another (the synchronous API) or in several threads
would outlive.

Only where nobody chose: asyncio's default policy, no watcher made yet.  A program that set
a watcher (or runs another event loop policy, such as uvloop's) keeps its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVarTuple, Unpack

_Ts = TypeVarTuple("_Ts")
_checked = False


class PidfdWatcher(asyncio.AbstractChildWatcher):
    """Each child waited for through its pidfd, a reader in the loop that is running when it
    starts (the loop that started it): no thread, no signal handler, any number of loops."""

    def add_child_handler(self, pid: int, callback: Callable[[int, int, Unpack[_Ts]], object],
                          *args: Unpack[_Ts]) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._exited, loop, pidfd, pid, callback, args)

    @staticmethod
    def _exited(loop: asyncio.AbstractEventLoop, pidfd: int, pid: int, callback: Callable[..., object],
                args: tuple[Any, ...]) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:   # reaped by someone else: asyncio's own answer for that
            code = 255
        callback(pid, code, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return False   # a handler goes when its child exits

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass   # each child is waited for in the loop that started it

    def close(self) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> PidfdWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def pidfd_watcher() -> None:
    """On Python 3.11 with asyncio's default policy and no watcher chosen, wait for children
    through :class:`PidfdWatcher` where the kernel has pidfds.  Checked once per process."""
    global _checked
    if _checked:
        return
    _checked = True
    if sys.version_info >= (3, 12):
        return   # 3.12 does it itself
    policy = asyncio.get_event_loop_policy()
    if type(policy) is not asyncio.DefaultEventLoopPolicy or getattr(policy, "_watcher", True) is not None:
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return   # no pidfds here: asyncio's thread per child
    policy.set_child_watcher(PidfdWatcher())
