"""What the emulator's kubelet makes a pod's container of: the ``podman run`` argv (command,
args and env with ``$(VAR)`` expansion and the ``fieldRef`` downward API, limits, runtime
class, user, host aliases) and its egress NetworkPolicies (the kubelet's module docstring,
step 3): :class:`Containers`, a part :class:`~.kubelet.Kubelet` owns."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...remote.runtime import gvisor_run_args
from . import netpol
from .objects import Obj, parse_quantity
from .podman import KubeletCore, container_name

__all__ = ["ConfigError", "EMULATOR_LABEL", "POD_UID_LABEL"]

EMULATOR_LABEL = "io.flowmesh.k8s-emulator"
POD_UID_LABEL = "io.kubernetes.pod.uid"


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes a ``$``; unknown references stay)."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, text)


class ConfigError(Exception):
    """A container's configuration the emulator cannot honour (CreateContainerConfigError)."""


class Containers:
    """A container's ``podman run`` argv and its egress rules, in ``core``'s container store:
    labelled for ``emulator_id``, the runtime class handlers ``runtime_classes``, the host's
    runtime and ulimit pins ``runtime_flags`` and ``ulimit_flags``."""

    def __init__(self, core: KubeletCore, *, emulator_id: str, runtime_classes: Mapping[str, str],
                 runtime_flags: Sequence[str], ulimit_flags: Sequence[str]) -> None:
        self.core = core
        self.id = emulator_id
        self.runtime_classes = dict(runtime_classes)
        self._runtime_flags = list(runtime_flags)
        self._ulimit_flags = list(ulimit_flags)

    def argv(self, pod: Obj, spec: Obj) -> list[str]:
        """The ``podman run`` argv of the pod's container (``spec``: the pod's spec);
        :class:`ConfigError` for what the emulator cannot honour."""
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
        argv = ["run", "-d", "--pull=never", "--name", container_name(pod),
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
        policies = netpol.egress_policies(self.core.store.items("networkpolicies.networking.k8s.io",
                                                           pod["metadata"]["namespace"]), pod)
        return bool(policies) and not any(spec.get("egress") for spec in policies)

    async def enforce_egress(self, pod: Obj, cid: str) -> str | None:
        """As a CNI that enforces NetworkPolicy: the egress rules of the policies that select
        the pod, as nftables in its network namespace (:mod:`.netpol`); None, or the error."""
        try:
            ruleset = netpol.egress_ruleset(netpol.egress_policies(
                self.core.store.items("networkpolicies.networking.k8s.io", pod["metadata"]["namespace"]), pod))
        except (ValueError, KeyError, TypeError) as exc:
            return f"an egress policy the emulator cannot enforce: {exc}"
        if ruleset is None:
            return None
        rc, out, err = await self.core.podman("inspect", "--format", "{{.State.Pid}}", cid)
        pid = out.strip()
        if rc != 0 or not pid.isdigit() or pid == "0":
            return f"no network namespace for the egress policy: {err.strip() or out.strip()}"
        rc, _, err = await self.core.command("nsenter", "-t", pid, "-n", "nft", "-f", "-", stdin=ruleset.encode())
        return None if rc == 0 else f"the egress policy could not be applied: {err.strip()}"


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
