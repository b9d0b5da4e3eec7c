"""What every part of the emulator's kubelet (:mod:`.kubelet`) shares (:class:`KubeletCore`,
which :class:`~.kubelet.Kubelet` owns and hands to its parts): its state, podman and other
processes run in the emulator's container store (and ended at shutdown), a pod's run record
and its status writes."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import hygiene
from . import podstatus
from .objects import Obj, ObjectStore

MAX_BACKOFF_S = 300.0   # the kubelet's MaxContainerBackOff / image back-off cap


@dataclass
class _PodRun:
    uid: str
    namespace: str
    name: str
    container: str                       # the podman container's name
    task: asyncio.Task[None] | None = None
    cid: str = ""                         # the running container's id


class KubeletCore:
    """The kubelet's shared state and podman: the object store, the container store's
    environment, the pods' runs (by uid), the processes shutdown must end, and whether the
    kubelet is closing.  :class:`~.kubelet.Kubelet` owns one and hands it to its parts."""

    def __init__(self, store: ObjectStore, *, root: Path) -> None:
        self.store = store
        self.root = root
        self.env = hygiene.store_env(root)
        self.runs: dict[str, _PodRun] = {}           # by pod uid
        self.procs: set[asyncio.subprocess.Process] = set()
        self.closing = False

    # ---- podman ------------------------------------------------------------------------
    async def podman(self, *args: str, kill_on_cancel: bool = True) -> tuple[int, str, str]:
        """Run podman in the store; (exit code, stdout, stderr).  Cancelled: the process is
        killed (or, ``kill_on_cancel=False``, waited for) before the cancel goes on."""
        return await self.command("podman", *args, kill_on_cancel=kill_on_cancel)

    async def command(self, *argv: str, stdin: bytes | None = None,
                      kill_on_cancel: bool = True) -> tuple[int, str, str]:
        """Run ``argv`` (podman, or nsenter into a pod), as :meth:`podman` says."""
        proc = await asyncio.create_subprocess_exec(
            *argv, env=self.env, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.procs.add(proc)
        try:
            out, err = await proc.communicate(stdin)
        except asyncio.CancelledError:
            if kill_on_cancel or self.closing:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
            raise
        finally:
            self.procs.discard(proc)
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def track(self, proc: asyncio.subprocess.Process) -> None:
        """A process started elsewhere (an exec, ``podman logs -f``) that shutdown must end."""
        self.procs.add(proc)

    def untrack(self, proc: asyncio.subprocess.Process) -> None:
        self.procs.discard(proc)

    def container_name(self, pod: Obj) -> str:
        return container_name(pod)

    def container_id(self, pod: Obj) -> str:
        """The running container of a pod ('' when none)."""
        run = self.runs.get(pod["metadata"]["uid"])
        return run.cid if run else ""

    # ---- status helpers -------------------------------------------------------------------
    def update(self, run: _PodRun, mutate: Any) -> Obj | None:
        return self.store.update("pods", run.namespace, run.name, mutate, uid=run.uid)

    def waiting(self, run: _PodRun, reason: str, message: str | None = None) -> None:
        self.update(run, lambda p: podstatus.waiting(p, reason, message))


def container_name(pod: Obj) -> str:
    """The podman container's name for a pod: ``k8s_<ns>_<pod>_<uid8>``."""
    meta = pod["metadata"]
    return f"k8s_{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else lines[-1]) if lines else ""
