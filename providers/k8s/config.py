"""Where the ``k8s`` provider runs pods: clusters and namespaces, read the way kubectl reads them.

* ``KUBECONFIG`` (one file or several joined with ``:``, merged as kubectl merges them),
  else ``~/.kube/config``: every context in it, or only those named (``contexts=``); a
  context's namespace is its own ``namespace`` field, else ``default``;
  ``namespaces=`` replaces it for every context.
* Inside a pod (``KUBERNETES_SERVICE_HOST`` set and no kubeconfig): the in-cluster service
  account (its token, CA and namespace under ``/var/run/secrets/kubernetes.io/serviceaccount``),
  as the context ``in-cluster``.

Each (context, namespace) is one *target*: the region and zone of an offer
(``infra=("k8s/<context>/<namespace>",)``).  The official client (``kubernetes``) loads the
credentials; its own retries are switched off (``Configuration.retries = False``: urllib3
raises at once) because the provisioner owns retries.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowmesh_sdk.errors import AuthError, SpecError

from .errors import PROVIDER

IN_CLUSTER = "in-cluster"
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True, slots=True)
class Target:
    """One namespace of one cluster: where pods of an offer go."""

    context: str
    namespace: str

    @property
    def key(self) -> str:
        return f"{self.context}/{self.namespace}"


def kubeconfig_path(explicit: str | None = None) -> str:
    return explicit or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def _exists(path: str) -> bool:
    return any(Path(p).expanduser().is_file() for p in path.split(os.pathsep) if p)


def load(kubeconfig: str | None, contexts: Sequence[str] | None,
         namespaces: Sequence[str] | None) -> tuple[list[Target], dict[str, Any]]:
    """The targets and one ``kubernetes.client.Configuration`` per context (blocking: reads files)."""
    from kubernetes import client, config   # the k8s extra

    path = kubeconfig_path(kubeconfig)
    configs: dict[str, Any] = {}
    own_ns: dict[str, str] = {}
    if not _exists(path) and os.environ.get("KUBERNETES_SERVICE_HOST") and not kubeconfig:
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        configs[IN_CLUSTER] = cfg
        own_ns[IN_CLUSTER] = SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.is_file() else "default"
    else:
        if not _exists(path):
            raise AuthError(f"no kubeconfig at {path} (set KUBECONFIG, or pass K8sProvider(kubeconfig=...)); "
                            "inside a pod the service account is used", provider=PROVIDER, code="NoKubeconfig")
        try:
            listed, _current = config.list_kube_config_contexts(config_file=path)
        except config.ConfigException as exc:
            raise AuthError(f"the kubeconfig at {path} cannot be read: {exc}", provider=PROVIDER,
                            code="BadKubeconfig") from exc
        known = {c["name"]: c.get("context") or {} for c in listed}
        wanted = list(contexts) if contexts else list(known)
        for name in wanted:
            if name not in known:
                raise SpecError("k8s.contexts", f"context {name!r} is not in {path}; it has "
                                                f"{', '.join(sorted(known)) or 'none'}")
            cfg = client.Configuration()
            config.load_kube_config(config_file=path, context=name, client_configuration=cfg,
                                    persist_config=False)
            configs[name] = cfg
            own_ns[name] = str(known[name].get("namespace") or "default")
    for cfg in configs.values():
        cfg.retries = False   # the provisioner owns retries
    targets = [Target(ctx, ns) for ctx in configs for ns in (namespaces or [own_ns[ctx]])]
    return targets, configs
