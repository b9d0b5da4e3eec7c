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
import base64
import contextlib
import copy
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...remote.runtime import gvisor_run_args
from .. import hygiene
from . import netpol, podstatus
from .admission import DOCKER_CONFIG_JSON
from .objects import Obj, ObjectStore, now_rfc3339, parse_quantity
from .scheduler import DEFAULT_NODES, Node, Scheduler, node_object

__all__ = ["DEFAULT_NODES", "Kubelet", "Node", "node_object"]

EMULATOR_LABEL = "io.flowmesh.k8s-emulator"
POD_UID_LABEL = "io.kubernetes.pod.uid"
MAX_BACKOFF_S = 300.0   # the kubelet's MaxContainerBackOff / image back-off cap


def _registry_allowed(image: str) -> bool:
    """Whether an image reference names a registry on 127.0.0.0/8 (or localhost)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    if not first or not ("." in first or ":" in first or first == "localhost"):
        return False   # a short name: podman would search registries elsewhere
    host = first.rsplit(":", 1)[0] if first.count(":") == 1 else first
    return host == "localhost" or re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host) is not None


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes a ``$``; unknown references stay)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


class ConfigError(Exception):
    """A container's configuration the emulator cannot honour (CreateContainerConfigError)."""


@dataclass
class _PodRun:
    uid: str
    namespace: str
    name: str
    container: str                       # the podman container's name
    task: asyncio.Task[None] | None = None
    cid: str = ""                         # the running container's id


class Kubelet:
    """The kubelet of every node, and the scheduler's owner (see the module docstring)."""

    def __init__(self, store: ObjectStore, nodes: Sequence[Node], *, root: Path, emulator_id: str, version: str,
                 runtime_classes: Mapping[str, str], pull_backoff_s: float = 10.0,
                 restart_backoff_s: float = 10.0) -> None:
        from ...imagebuild.build import podman_run_ulimit_args, podman_runtime_args
        self.store = store
        self.nodes = {n.name: n for n in nodes}
        self.ready = {n.name: True for n in nodes}
        self.root = root
        self.env = hygiene.store_env(root)
        self.id = emulator_id
        self.version = version
        self.runtime_classes = dict(runtime_classes)
        self.pull_backoff_s = pull_backoff_s
        self.refuse_pulls: str | None = None   # every pull fails with this (the node cannot reach the registry)
        self.restart_backoff_s = restart_backoff_s
        self._runtime_flags = podman_runtime_args()
        self._ulimit_flags = podman_run_ulimit_args()
        self._runs: dict[str, _PodRun] = {}           # by pod uid
        self._procs: set[asyncio.subprocess.Process] = set()
        self._pull_locks: dict[str, asyncio.Lock] = {}
        self.scheduler = Scheduler(store, self.nodes, self.ready, running=self._runs, start=self._start)
        self.pulls: list[str] = []                    # every image pull started, in order
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
        self._procs.add(proc)
        try:
            out, err = await proc.communicate(stdin)
        except asyncio.CancelledError:
            if kill_on_cancel or self.closing:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
            raise
        finally:
            self._procs.discard(proc)
        return proc.returncode or 0, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")

    def track(self, proc: asyncio.subprocess.Process) -> None:
        """A process started elsewhere (an exec, ``podman logs -f``) that shutdown must end."""
        self._procs.add(proc)

    def untrack(self, proc: asyncio.subprocess.Process) -> None:
        self._procs.discard(proc)

    def container_name(self, pod: Obj) -> str:
        meta = pod["metadata"]
        return f"k8s_{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"

    def container_id(self, pod: Obj) -> str:
        """The running container of a pod ('' when none)."""
        run = self._runs.get(pod["metadata"]["uid"])
        return run.cid if run else ""

    # ---- status helpers -------------------------------------------------------------------
    def _update(self, run: _PodRun, mutate: Any) -> Obj | None:
        return self.store.update("pods", run.namespace, run.name, mutate, uid=run.uid)

    def _waiting(self, run: _PodRun, reason: str, message: str | None = None) -> None:
        self._update(run, lambda p: podstatus.waiting(p, reason, message))

    # ---- scheduling ---------------------------------------------------------------------------
    def admit(self, pod: Obj) -> None:
        """A pod was created: schedule it (now or when something frees)."""
        self.scheduler.queue(pod)
        self.schedule()

    def schedule(self) -> None:
        """Bind every pending pod that fits somewhere; mark the others Unschedulable."""
        if self.closing:
            return
        self.scheduler.schedule()

    # ---- a pod's life -------------------------------------------------------------------------
    def _start(self, namespace: str, name: str, uid: str) -> None:
        pod = self.store.peek("pods", namespace, name)
        assert pod is not None
        run = _PodRun(uid, namespace, name, self.container_name(pod))
        self._runs[uid] = run
        self._update(run, podstatus.accepted)
        run.task = asyncio.ensure_future(self._life(run))

    async def _life(self, run: _PodRun) -> None:
        restarts = 0
        while True:
            pod = self.store.peek("pods", run.namespace, run.name)
            if pod is None or pod["metadata"]["uid"] != run.uid:
                return
            spec = copy.deepcopy(pod["spec"])
            image_id = await self._ensure_image(run, spec["containers"][0], pod)
            code = await self._run_once(run, pod, spec, image_id)
            policy = spec.get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                self._finish(run, code)
                return
            restarts += 1
            delay = 0.0 if restarts == 1 else min(self.restart_backoff_s * 2 ** (restarts - 2), MAX_BACKOFF_S)
            await self._backoff_restart(run, delay)

    def _pull_auths(self, pod: Obj) -> dict[str, Any]:
        """The registry credentials of the pod's ``imagePullSecrets`` (their
        ``.dockerconfigjson`` ``auths``, the first secret naming a registry winning, as the
        kubelet's keyring does); a secret that is missing or of another type is skipped, as
        the kubelet skips it (and pulls without it)."""
        auths: dict[str, Any] = {}
        meta = pod["metadata"]
        for ref in (pod.get("spec") or {}).get("imagePullSecrets") or ():
            secret = self.store.peek("secrets", meta["namespace"], str(ref.get("name") or ""))
            if secret is None or secret.get("type") != "kubernetes.io/dockerconfigjson":
                continue
            raw = base64.b64decode((secret.get("data") or {}).get(DOCKER_CONFIG_JSON, ""))
            for host, entry in (json.loads(raw or b"{}").get("auths") or {}).items():
                auths.setdefault(host, entry)
        return auths

    async def _pull(self, image: str, pod: Obj) -> tuple[int, str]:
        """``podman pull`` of ``image`` with the pod's pull-secret credentials (an authfile
        of them, removed after); (exit code, stderr)."""
        auths = self._pull_auths(pod)
        if not auths:
            rc, _, err = await self.podman("pull", "--tls-verify=false", "--quiet", image)
            return rc, err
        fd, path = tempfile.mkstemp(prefix="pull-auth-", suffix=".json", dir=self.root)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": auths}, f)
            rc, _, err = await self.podman("pull", "--tls-verify=false", "--quiet", "--authfile", path, image)
            return rc, err
        finally:
            os.unlink(path)

    async def _ensure_image(self, run: _PodRun, container: Obj, pod: Obj) -> str:
        image = container["image"]
        policy = container.get("imagePullPolicy", "IfNotPresent")
        backoff = self.pull_backoff_s
        while True:
            lock = self._pull_locks.setdefault(image, asyncio.Lock())
            async with lock:
                rc, out, _ = await self.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image)
                if rc == 0 and policy != "Always":
                    return _image_id(image, out)
                err = ""
                if policy == "Never":
                    pass
                elif self.refuse_pulls is not None:
                    err = self.refuse_pulls
                elif not _registry_allowed(image):
                    err = (f"the k8s emulator pulls only from registries on 127.0.0.0/8 or localhost, "
                           f"not {image!r}")
                else:
                    self.pulls.append(image)
                    rc, stderr = await self._pull(image, pod)
                    if rc == 0:
                        rc, out, _ = await self.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image)
                        return _image_id(image, out)
                    err = _last_error(stderr) or f"podman pull exited {rc}"
            if policy == "Never":
                self._waiting(run, "ErrImageNeverPull",
                              f'Container image "{image}" is not present with pull policy of Never')
                await asyncio.Event().wait()
            self._waiting(run, "ErrImagePull", err)
            await asyncio.sleep(min(1.0, backoff))
            self._waiting(run, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

    def _argv(self, pod: Obj, spec: Obj) -> list[str]:
        c = spec["containers"][0]
        meta = pod["metadata"]
        env: dict[str, str] = {}
        for e in c.get("env") or []:
            name = e["name"]
            if "value" in e or "valueFrom" not in e:
                env[name] = _expand(str(e.get("value", "")), env)
                continue
            ref = (e.get("valueFrom") or {}).get("fieldRef")
            if ref is None:
                kinds = ", ".join(sorted((e.get("valueFrom") or {}).keys()))
                raise ConfigError(f"env {name}: {kinds} is not served by the k8s emulator "
                                  "(no Secrets or ConfigMaps)")
            env[name] = _field_ref(pod, str(ref.get("fieldPath", "")))
        argv = ["run", "-d", "--pull=never", "--name", self.container_name(pod),
                "--label", f"{EMULATOR_LABEL}={self.id}", "--label", f"{POD_UID_LABEL}={meta['uid']}"]
        handler = self.runtime_classes[spec["runtimeClassName"]] if spec.get("runtimeClassName") else None
        if handler is None:
            argv += self._runtime_flags
        elif Path(handler).name == "runsc":   # gVisor as the SDK runs it: its own loopback only
            argv += gvisor_run_args([], 0)[0]
        else:
            argv += ["--runtime", handler]
        argv += self._ulimit_flags
        hostname = meta["name"][:63].rstrip("-.")
        argv += ["--hostname", hostname]
        if self.denies_egress(pod):
            argv.append("--network=none")
        for alias in spec.get("hostAliases") or ():
            argv += [f"--add-host={name}:{alias['ip']}" for name in alias.get("hostnames") or ()]
        limits = ((c.get("resources") or {}).get("limits") or {})
        if "cpu" in limits:
            argv += ["--cpus", f"{float(parse_quantity(limits['cpu'])):g}"]
        if "memory" in limits:
            mem = str(int(parse_quantity(limits["memory"])))
            argv += ["--memory", mem, "--memory-swap", mem]
        if c.get("workingDir"):
            argv += ["--workdir", str(c["workingDir"])]
        sec = c.get("securityContext") or {}
        if "runAsUser" in sec:
            argv += ["--user", f"{sec['runAsUser']}" + (f":{sec['runAsGroup']}" if "runAsGroup" in sec else "")]
        if c.get("stdin"):
            argv.append("-i")
        if c.get("tty"):
            argv.append("-t")
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        if c.get("command"):
            argv += ["--entrypoint", json.dumps([_expand(str(a), env) for a in c["command"]])]
        argv.append(c["image"])
        argv += [_expand(str(a), env) for a in c.get("args") or []]
        return argv

    def denies_egress(self, pod: Obj) -> bool:
        """Whether NetworkPolicies deny the pod all egress: one selects it with Egress in
        its policyTypes, and no policy selecting it for egress allows any."""
        policies = netpol.egress_policies(self.store.items("networkpolicies.networking.k8s.io",
                                                           pod["metadata"]["namespace"]), pod)
        return bool(policies) and not any(spec.get("egress") for spec in policies)

    async def _enforce_egress(self, pod: Obj, cid: str) -> str | None:
        """As a CNI that enforces NetworkPolicy: the egress rules of the policies that select
        the pod, as nftables in its network namespace (:mod:`.netpol`); None, or the error."""
        try:
            ruleset = netpol.egress_ruleset(netpol.egress_policies(
                self.store.items("networkpolicies.networking.k8s.io", pod["metadata"]["namespace"]), pod))
        except (ValueError, KeyError, TypeError) as exc:
            return f"an egress policy the emulator cannot enforce: {exc}"
        if ruleset is None:
            return None
        rc, out, err = await self.podman("inspect", "--format", "{{.State.Pid}}", cid)
        pid = out.strip()
        if rc != 0 or not pid.isdigit() or pid == "0":
            return f"no network namespace for the egress policy: {err.strip() or out.strip()}"
        rc, _, err = await self.command("nsenter", "-t", pid, "-n", "nft", "-f", "-", stdin=ruleset.encode())
        return None if rc == 0 else f"the egress policy could not be applied: {err.strip()}"

    async def _run_once(self, run: _PodRun, pod: Obj, spec: Obj, image_id: str) -> int:
        """Start the container, wait for its end, record it; its exit code."""
        await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
        try:
            argv = self._argv(pod, spec)
        except ConfigError as exc:
            self._waiting(run, "CreateContainerConfigError", str(exc))
            await asyncio.Event().wait()
            raise
        rc, out, err = await self.podman(*argv, kill_on_cancel=False)
        started = now_rfc3339()
        if rc != 0:
            await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            message = _last_error(err) or f"podman run exited {rc}"
            self._terminated(run, 128, "StartError", message, started, image_id, "")
            return 128
        cid = out.strip().splitlines()[-1] if out.strip() else ""
        run.cid = cid
        if "--network=none" not in argv and (why := await self._enforce_egress(pod, cid)) is not None:
            await self.podman("rm", "-f", "-t", "0", "--ignore", cid, kill_on_cancel=False)
            run.cid = ""
            self._terminated(run, 128, "StartError", why, started, image_id, "")
            return 128
        self._update(run, lambda p: podstatus.running(p, started, cid, image_id))
        rc, out, err = await self.podman("wait", cid)
        code = int(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else 137
        rc2, info, _ = await self.podman("inspect", "--format", "{{.State.OOMKilled}}", cid)
        oom = rc2 == 0 and info.strip() == "true"
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        run.cid = ""
        self._terminated(run, code, reason, None, started, image_id, cid)
        return code

    def _terminated(self, run: _PodRun, code: int, reason: str, message: str | None, started: str,
                    image_id: str, cid: str) -> None:
        finished = now_rfc3339()
        self._update(run, lambda p: podstatus.terminated(p, code, reason, message, started, finished, image_id, cid))

    def _finish(self, run: _PodRun, code: int) -> None:
        self._update(run, lambda p: podstatus.ended(p, code))
        self.schedule()

    async def _backoff_restart(self, run: _PodRun, delay: float) -> None:
        self._update(run, lambda p: podstatus.restarting(p, delay, run.name, run.namespace, run.uid))
        if delay:
            await asyncio.sleep(delay)

    # ---- ending pods ------------------------------------------------------------------------
    async def _stop_run(self, uid: str, *, remove: bool) -> _PodRun | None:
        """End a pod's task and its container: removed (``remove``) or only killed (kept
        for its logs)."""
        run = self._runs.get(uid)
        if run is None:
            return None
        if run.task is not None and not run.task.done():
            run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await run.task
        run.task = None
        run.cid = ""
        if remove:
            await self.podman("rm", "-f", "-t", "0", "--ignore", run.container, kill_on_cancel=False)
            self._runs.pop(uid, None)
        else:
            await self.podman("kill", run.container, kill_on_cancel=False)
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
        self.closing = True
        tasks = [r.task for r in self._runs.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for proc in list(self._procs):
            with contextlib.suppress(ProcessLookupError, asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)


def _image_id(image: str, inspect_out: str) -> str:
    parts = inspect_out.split()
    digest = parts[1] if len(parts) > 1 else ""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}@{digest}" if digest else (f"sha256:{parts[0]}" if parts else "")


def _last_error(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    return (errors[-1] if errors else lines[-1]) if lines else ""


def _field_ref(pod: Obj, path: str) -> str:
    meta, spec = pod["metadata"], pod.get("spec") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": "127.0.0.1",
              "status.hostIP": "127.0.0.1", "status.podIPs": "127.0.0.1", "status.hostIPs": "127.0.0.1"}
    if path in simple:
        return str(simple[path] or "")
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    raise ConfigError(f"fieldRef {path!r} is not supported")

