"""The emulator's kubelet: every pod is a real podman container in the emulator's own
container store (one store for all nodes: an image pulled for one node is present on
every node).

Per pod, on the server's loop (asyncio subprocesses; the loop never blocks):

1. schedule -- :mod:`.scheduler` (the :class:`~.scheduler.Scheduler` the kubelet owns):
   the scheduling order, node fit, the Unschedulable message, and the kubelet's admission
   of a pod bound by its creator.  The steps below are the kubelet's; the pod statuses
   they write are :mod:`.podstatus`'s.
2. pull -- ``podman pull --tls-verify=false IMAGE`` unless the image is in the store,
   with the registry credentials of the pod's ``imagePullSecrets`` (``kubernetes.io/
   dockerconfigjson`` Secrets: their ``auths`` as an ``--authfile``; a missing one is
   skipped, as the kubelet skips it)
   (``imagePullPolicy: Always`` pulls on every start; ``Never`` never pulls:
   ``ErrImageNeverPull``).  Only registries on 127.0.0.0/8 (or ``localhost``) are pulled
   from: any other reference fails as a pull does.  A failed pull shows ``ErrImagePull``
   (podman's error as the message), then ``ImagePullBackOff`` (``Back-off pulling image
   "X"``) while it waits ``pull_backoff_s``, doubled per failure up to 300 s, and tries again.
3. run -- ``podman run -d --pull=never --name k8s_<ns>_<pod>_<uid8>`` labelled only
   ``io.flowmesh.k8s-emulator=<emulator id>`` and ``io.kubernetes.pod.uid=<uid>``, with the
   container's ``command`` (as the entrypoint: the image's CMD is dropped, as Kubernetes
   does) and ``args`` (``$(VAR)`` expanded from its env), ``env`` (``value`` and the
   ``fieldRef`` downward API; ``secretKeyRef``/``configMapKeyRef`` give
   ``CreateContainerConfigError``: Secrets are served for pull credentials only, ConfigMaps
   not at all), ``workingDir``,
   ``securityContext.runAsUser/runAsGroup``, ``hostAliases`` (``--add-host``), ``stdin``/``tty``, ``limits.cpu`` as
   ``--cpus`` and ``limits.memory`` as ``--memory``/``--memory-swap``, the host's runtime
   and ulimit pins (``flowmesh_sdk.imagebuild.build``), ``--runtime HANDLER`` for a
   configured ``runtimeClassName`` (a ``runsc`` handler gets the SDK's gVisor flags,
   ``remote.runtime.gvisor_run_args``: ``--runtime-flag network=none``, so such a pod has
   only its loopback), and ``--network=none`` when a deny-all-egress NetworkPolicy
   selects the pod; other egress policies that select it are enforced as a CNI would,
   their rules as nftables in the pod's network namespace (:mod:`.netpol`; decided when
   the container starts; a pod no policy selects is on podman's default network,
   unrestricted).  The pod is then
   Running: the container running and ready (readiness probes are not run), conditions
   Initialized/ContainersReady/Ready True,
   ``podIP`` and ``hostIP`` 127.0.0.1.  One container per pod: the API refuses more, and
   init containers.  The container's end (``podman wait``): restartPolicy Never, or
   OnFailure after exit 0, ends the pod (Succeeded, or Failed; terminated ``Completed``,
   ``Error`` or ``OOMKilled`` with the exit code); otherwise a new container is started,
   ``restartCount`` + 1, the first at once and then after ``CrashLoopBackOff`` waits
   (``restart_backoff_s``, doubled up to 300 s).  A container that cannot start is
   terminated ``StartError``, exit code 128, podman's error as the message.
4. delete -- ``podman rm -f -t 0`` (a grace period is recorded on the pod as
   ``deletionTimestamp``/``deletionGracePeriodSeconds`` but not waited for), then the
   object goes.

Switches: :meth:`Kubelet.evict` (as the kubelet's eviction manager: the container killed,
phase Failed, ``status.reason`` ``Evicted``, a ``DisruptionTarget`` condition with reason
``TerminationByKubelet``), :meth:`Kubelet.lose_node` (the node's ``Ready`` goes
``Unknown`` with the ``node.kubernetes.io/unreachable`` taints; its pods' containers are
killed and the pods are marked -- not deleted -- phase Failed, ``status.reason``
``NodeLost``, ``Node N which was running pod P is unresponsive``, as the node controller
once wrote it) and :meth:`Kubelet.restore_node`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import podstatus
from .containers import EMULATOR_LABEL, POD_UID_LABEL, ConfigError, Containers
from .objects import Obj, ObjectStore, now_rfc3339
from .podman import MAX_BACKOFF_S, KubeletCore, _last_error, _PodRun
from .pulls import ImagePuller
from .scheduler import DEFAULT_NODES, Node, Scheduler, node_object

__all__ = ["DEFAULT_NODES", "Kubelet", "Node", "node_object",
           # importable from here as before the split
           "ConfigError", "EMULATOR_LABEL", "MAX_BACKOFF_S", "POD_UID_LABEL"]


class Kubelet:
    """The kubelet of every node, and the scheduler's owner (see the module docstring).  Its
    parts: ``core`` (the state and podman, :mod:`.podman`), ``scheduler``, ``puller``
    (:mod:`.pulls`) and ``containers`` (:mod:`.containers`)."""

    def __init__(self, store: ObjectStore, nodes: Sequence[Node], *, root: Path, emulator_id: str, version: str,
                 runtime_classes: Mapping[str, str], pull_backoff_s: float = 10.0,
                 restart_backoff_s: float = 10.0) -> None:
        from ...imagebuild.build import podman_run_ulimit_args, podman_runtime_args
        self.store = store
        self.nodes = {n.name: n for n in nodes}
        self.ready = {n.name: True for n in nodes}
        self.version = version
        self.restart_backoff_s = restart_backoff_s
        self.core = KubeletCore(store, root=root)
        self.puller = ImagePuller(self.core, pull_backoff_s=pull_backoff_s)
        self.containers = Containers(self.core, emulator_id=emulator_id, runtime_classes=runtime_classes,
                                     runtime_flags=podman_runtime_args(), ulimit_flags=podman_run_ulimit_args())
        self.scheduler = Scheduler(store, self.nodes, self.ready, running=self.core.runs, start=self._start)

    # ---- the parts' settings and services, as the API and the emulator use them ---------------
    @property
    def env(self) -> dict[str, str]:
        """The environment podman runs in (the emulator's container store)."""
        return self.core.env

    @property
    def closing(self) -> bool:
        return self.core.closing

    @property
    def pulls(self) -> list[str]:
        """Every image pull started, in order."""
        return self.puller.pulls

    @property
    def pull_backoff_s(self) -> float:
        return self.puller.pull_backoff_s

    @pull_backoff_s.setter
    def pull_backoff_s(self, value: float) -> None:
        self.puller.pull_backoff_s = value

    @property
    def refuse_pulls(self) -> str | None:
        """When set, every pull fails with this (the node cannot reach the registry)."""
        return self.puller.refuse_pulls

    @refuse_pulls.setter
    def refuse_pulls(self, value: str | None) -> None:
        self.puller.refuse_pulls = value

    async def podman(self, *args: str, kill_on_cancel: bool = True) -> tuple[int, str, str]:
        """Run podman in the store (:meth:`.podman.KubeletCore.podman`)."""
        return await self.core.podman(*args, kill_on_cancel=kill_on_cancel)

    def track(self, proc: asyncio.subprocess.Process) -> None:
        """A process started elsewhere (an exec, ``podman logs -f``) that shutdown must end."""
        self.core.track(proc)

    def untrack(self, proc: asyncio.subprocess.Process) -> None:
        self.core.untrack(proc)

    def container_name(self, pod: Obj) -> str:
        return self.core.container_name(pod)

    def container_id(self, pod: Obj) -> str:
        """The running container of a pod ('' when none)."""
        return self.core.container_id(pod)

    def denies_egress(self, pod: Obj) -> bool:
        """Whether NetworkPolicies deny the pod all egress (:meth:`.containers.Containers.denies_egress`)."""
        return self.containers.denies_egress(pod)
    # ---- scheduling ---------------------------------------------------------------------------
    def admit(self, pod: Obj) -> None:
        """A pod was created: schedule it (now or when something frees)."""
        self.scheduler.queue(pod)
        self.schedule()

    def schedule(self) -> None:
        """Bind every pending pod that fits somewhere; mark the others Unschedulable."""
        if self.core.closing:
            return
        self.scheduler.schedule()

    # ---- a pod's life -------------------------------------------------------------------------
    def _start(self, namespace: str, name: str, uid: str) -> None:
        pod = self.store.peek("pods", namespace, name)
        assert pod is not None
        run = _PodRun(uid, namespace, name, self.core.container_name(pod))
        self.core.runs[uid] = run
        self.core.update(run, podstatus.accepted)
        run.task = asyncio.ensure_future(self._life(run))

    async def _life(self, run: _PodRun) -> None:
        restarts = 0
        while True:
            pod = self.store.peek("pods", run.namespace, run.name)
            if pod is None or pod["metadata"]["uid"] != run.uid:
                return
            spec = copy.deepcopy(pod["spec"])
            image_id = await self.puller.ensure_image(run, spec["containers"][0], pod)
            code = await self._run_once(run, pod, spec, image_id)
            policy = spec.get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self._finish(run, code)
                return
            restarts += 1
            delay = 0.0 if restarts == 1 else min(self.restart_backoff_s * 2 ** (restarts - 2), MAX_BACKOFF_S)
            await self._backoff_restart(run, delay)

    async def _run_once(self, run: _PodRun, pod: Obj, spec: Obj, image_id: str) -> int:
        """Start the container, wait for its end, record it; its exit code."""
        await self.core.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
        try:
            argv = self.containers.argv(pod, spec)
        except ConfigError as exc:
            self.core.waiting(run, "CreateContainerConfigError", str(exc))
            await asyncio.Event().wait()
            raise
        rc, out, err = await self.core.podman(*argv, kill_on_cancel=False)
        started = now_rfc3339()
        if rc != 0:
            await self.core.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            message = _last_error(err) or f"podman run exited {rc}"
            self._terminated(run, 128, "StartError", message, started, image_id, "")
            return 128
        cid = out.strip().splitlines()[-1] if out.strip() else ""
        run.cid = cid
        if "--network=none" not in argv and (why := await self.containers.enforce_egress(pod, cid)) is not None:
            await self.core.podman("rm", "-f", "-t", "0", "--ignore", cid, kill_on_cancel=False)
            run.cid = ""
            self._terminated(run, 128, "StartError", why, started, image_id, "")
            return 128
        self.core.update(run, lambda p: podstatus.running(p, started, cid, image_id))
        rc, out, err = await self.core.podman("wait", cid)
        code = int(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else 137
        rc2, info, _ = await self.core.podman("inspect", "--format", "{{.State.OOMKilled}}", cid)
        oom = rc2 == 0 and info.strip() == "true"
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        run.cid = ""
        self._terminated(run, code, reason, None, started, image_id, cid)
        return code

    def _terminated(self, run: _PodRun, code: int, reason: str, message: str | None, started: str,
                    image_id: str, cid: str) -> None:
        finished = now_rfc3339()
        self.core.update(run, lambda p: podstatus.terminated(p, code, reason, message, started, finished,
                                                             image_id, cid))

    def _finish(self, run: _PodRun, code: int) -> None:
        self.core.update(run, lambda p: podstatus.ended(p, code))
        self.schedule()

    async def _backoff_restart(self, run: _PodRun, delay: float) -> None:
        self.core.update(run, lambda p: podstatus.restarting(p, delay, run.name, run.namespace, run.uid))
        if delay:
            await asyncio.sleep(delay)

    # ---- ending pods ------------------------------------------------------------------------
    async def _stop_run(self, uid: str, *, remove: bool) -> _PodRun | None:
        """End a pod's task and its container: removed (``remove``) or only killed (kept
        for its logs)."""
        run = self.core.runs.get(uid)
        if run is None:
            return None
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run.task
        run.task = None
        run.cid = ""
        if remove:
            await self.core.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            self.core.runs.pop(uid, None)
        else:
            await self.core.podman("kill", run.container, kill_on_cancel=False)
        return run

    async def remove(self, pod: Obj) -> None:
        """The pod is being deleted: its container goes (``podman rm -f -t 0``)."""
        uid = pod["metadata"]["uid"]
        self.scheduler.forget(uid)
        await self._stop_run(uid, remove=True)

    def forget(self, pod: Obj) -> None:
        self.scheduler.forget(pod["metadata"]["uid"])

    async def evict(self, namespace: str, name: str, reason: str, message: str) -> Obj:
        pod = self.store.get("pods", namespace, name)
        uid = pod["metadata"]["uid"]
        run = await self._stop_run(uid, remove=False)
        finished = now_rfc3339()
        out = self.store.update("pods", namespace, name,
                                lambda p: podstatus.evicted(p, reason, message, finished, run is not None), uid=uid)
        self.schedule()
        assert out is not None
        return out

    async def lose_node(self, node: str) -> None:
        if node not in self.nodes:
            raise KeyError(f"no node {node!r}")
        self.ready[node] = False
        self._put_node(node)
        for pod in [p for p in self.scheduler.bound(node)]:
            meta = pod["metadata"]
            run = await self._stop_run(meta["uid"], remove=False)
            finished = now_rfc3339()

            def mutate(p: Obj, had: bool = run is not None, finished: str = finished) -> None:
                podstatus.node_lost(p, node, finished, had)
            self.store.update("pods", meta["namespace"], meta["name"], mutate, uid=meta["uid"])
        self.schedule()

    def restore_node(self, node: str) -> None:
        self.ready[node] = True
        self._put_node(node)
        self.schedule()

    def _put_node(self, name: str) -> None:
        fresh = node_object(self.nodes[name], self.version, ready=self.ready[name])

        def mutate(obj: Obj) -> None:
            obj["spec"] = fresh["spec"]
            obj["status"] = fresh["status"]
        self.store.update("nodes", "", name, mutate)

    # ---- the end ----------------------------------------------------------------------------
    async def shutdown(self, timeout_s: float = 20.0) -> None:
        """Cancel every pod's task and kill every podman process still running."""
        self.core.closing = True
        tasks = [r.task for r in self.core.runs.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        for proc in list(self.core.procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for proc in list(self.core.procs):
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
