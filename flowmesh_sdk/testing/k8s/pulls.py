"""The emulator's kubelet pulling a pod's image: only from registries on loopback, with the
credentials of the pod's ``imagePullSecrets``, under the pull policy, with ``ErrImagePull`` /
``ImagePullBackOff`` between tries (the kubelet's module docstring, step 2): :class:`ImagePuller`,
a part :class:`~.kubelet.Kubelet` owns."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import tempfile
from typing import Any

from .admission import DOCKER_CONFIG_JSON
from .objects import Obj
from .podman import MAX_BACKOFF_S, KubeletCore, _last_error, _PodRun


def _registry_allowed(image: str) -> bool:
    """Whether an image reference names a registry on 127.0.0.0/8 (or localhost)."""
    first = image.split("/", 1)[0] if "/" in image else ""
    if not first or not ("." in first or ":" in first or first == "localhost"):
        return False   # a short name: podman would search registries elsewhere
    host = first.rsplit(":", 1)[0] if first.count(":") == 1 else first
    return host == "localhost" or re.fullmatch(r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}", host) is not None


class ImagePuller:
    """Image pulls (one at a time per image), in ``core``'s container store.  ``pull_backoff_s``
    (the first back-off) and ``refuse_pulls`` (when set, every pull fails with it: the node
    cannot reach the registry) may change while it runs; ``pulls`` lists every pull started."""

    def __init__(self, core: KubeletCore, *, pull_backoff_s: float) -> None:
        self.core = core
        self.pull_backoff_s = pull_backoff_s
        self.refuse_pulls: str | None = None
        self.pulls: list[str] = []                    # every image pull started, in order
        self._locks: dict[str, asyncio.Lock] = {}

    def _pull_auths(self, pod: Obj) -> dict[str, Any]:
        """The registry credentials of the pod's ``imagePullSecrets`` (their
        ``.dockerconfigjson`` ``auths``, the first secret naming a registry winning, as the
        kubelet's keyring does); a secret that is missing or of another type is skipped, as
        the kubelet skips it (and pulls without it)."""
        auths: dict[str, Any] = {}
        meta = pod["metadata"]
        for ref in (pod.get("spec") or {}).get("imagePullSecrets") or ():
            secret = self.core.store.peek("secrets", meta["namespace"], str(ref.get("name") or ""))
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
            rc, _, err = await self.core.podman("pull", "--tls-verify=false", "--quiet", image)
            return rc, err
        fd, path = tempfile.mkstemp(prefix="pull-auth-", suffix=".json", dir=self.core.root)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"auths": auths}, f)
            rc, _, err = await self.core.podman("pull", "--tls-verify=false", "--quiet", "--authfile", path, image)
            return rc, err
        finally:
            os.unlink(path)

    async def ensure_image(self, run: _PodRun, container: Obj, pod: Obj) -> str:
        """The id of the container's image once it is in the store (pulled as its policy
        says); meanwhile the pod shows the pull's errors and back-offs."""
        image = container["image"]
        policy = container.get("imagePullPolicy", "IfNotPresent")
        backoff = self.pull_backoff_s
        while True:
            lock = self._locks.setdefault(image, asyncio.Lock())
            async with lock:
                rc, out, _ = await self.core.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}", image)
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
                        rc, out, _ = await self.core.podman("image", "inspect", "--format", "{{.Id}} {{.Digest}}",
                                                            image)
                        return _image_id(image, out)
                    err = _last_error(stderr) or f"podman pull exited {rc}"
            if policy == "Never":
                self.core.waiting(run, "ErrImageNeverPull",
                              f'Container image "{image}" is not present with pull policy of Never')
                await asyncio.Event().wait()
            self.core.waiting(run, "ErrImagePull", err)
            await asyncio.sleep(min(1.0, backoff))
            self.core.waiting(run, "ImagePullBackOff", f'Back-off pulling image "{image}"')
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


def _image_id(image: str, inspect_out: str) -> str:
    parts = inspect_out.split()
    digest = parts[1] if len(parts) > 1 else ""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return f"{repo}@{digest}" if digest else (f"sha256:{parts[0]}" if parts else "")
