"""The image half of :class:`~flowmesh_sdk.remote.runtime.ContainerRuntime`: look up,
pull, commit and push (snapshots) and remove images.

:class:`RuntimeImages` is a component that ``ContainerRuntime`` makes for each image
operation (its ``image_ops``) and forwards its image methods to; it is built with what it
needs: the runner, the settings, the runtime's probe (for the binary and the
user-namespace mapping) and the runtime's command-running callable.  Pulled snapshots get
their sparse files back (:mod:`.sparse`); snapshots of a user-namespaced sandbox get their
file owners shifted back (:mod:`.layershift`, run by the instance's ``python3``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from ..errors import ContainerRuntimeError, RegistryUnavailableError
from . import sparse
from .runner import CommandResult, Runner
from .runtime_args import pull_error
from .runtime_config import RuntimeConfig, RuntimeInfo

log = logging.getLogger("flowmesh.remote.runtime")
# A pull in one round trip (RuntimeImages.pull): nothing printed when the store has the image
# already; else the pull (its stderr and exit status, when it fails), then "pulled" and the
# image's sparse-files label and layer directories (_SPARSE_FORMAT) for _dig_holes.
# Arguments: the runtime binary, the reference, that format, then the pull's own flags.
PULL_SCRIPT = ('b=$1 ref=$2 fmt=$3; shift 3; '
               '"$b" image inspect --format "{{.Id}}" "$ref" >/dev/null 2>&1 && exit 0; '
               '"$b" pull --quiet "$@" "$ref" >/dev/null || exit; '
               'echo pulled; "$b" image inspect --format "$fmt" "$ref" 2>/dev/null || true')
_SPARSE_FORMAT = (f'{{{{index .Labels "{sparse.LABEL}"}}}}\n'
                  "{{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}")
# run by the instance's python3 on a committed user-namespaced snapshot (see layershift.py)
_LAYERSHIFT = (Path(__file__).parent / "layershift.py").read_text(encoding="utf-8")


class RunCommand(Protocol):
    """Run ``argv`` on the machine (``ContainerRuntime._run``): the settings' timeout unless
    ``timeout_s`` is given, a :class:`ContainerRuntimeError` on failure when ``check``."""

    def __call__(self, argv: Sequence[str], *, check: bool = True,
                 timeout_s: float | None = None) -> Awaitable[CommandResult]: ...


class RuntimePart:
    """What each component of a :class:`~.runtime.ContainerRuntime` is built with: the
    runner, the settings, the runtime's probe and its command-running callable."""

    __slots__ = ("runner", "config", "probe", "_run")

    def __init__(self, runner: Runner, config: RuntimeConfig, probe: Callable[[], Awaitable[RuntimeInfo]],
                 run: RunCommand) -> None:
        self.runner = runner
        self.config = config
        self.probe = probe
        self._run = run


class RuntimeImages(RuntimePart):
    """Image operations over ``runner`` (see the module docstring)."""

    __slots__ = ()

    # ---- images ----------------------------------------------------------------
    async def image_inspect(self, image: str) -> tuple[str, str] | None:
        """``(digest, image id)`` of an image in this machine's store, None when absent.
        The digest is the manifest digest when known, else the image id."""
        info = await self.probe()
        res = await self._run([info.binary, "image", "inspect", "--format",
                               "{{.Digest}} {{.Id}}", image], check=False)
        if not res.ok:
            return None
        digest, _, ident = res.text().strip().partition(" ")
        ident = ident.removeprefix("sha256:")
        return (digest if digest.startswith("sha256:") else f"sha256:{ident}"), ident

    async def pull(self, ref: str, *, tls_verify: bool = True, authfile: str | None = None) -> bool:
        """Pull ``ref`` (normally ``repo@digest``); False (nothing done) when it is already here.

        Errors are the SDK's: ImageNotFoundError, AuthError, ThrottledError (429) and
        RegistryUnavailableError (down, or a layer that failed its digest check), so the
        pull budget can retry what is worth retrying."""
        info = await self.probe()
        flags = [] if tls_verify else ["--tls-verify=false"]
        if authfile:
            flags += ["--authfile", authfile]
        res = await self._run(["sh", "-c", PULL_SCRIPT, "sh", info.binary, ref, _SPARSE_FORMAT, *flags],
                              check=False, timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:   # named as the pull it is (its stderr and exit status are the pull's)
            raise pull_error(ref, self.runner.label,
                             dataclasses.replace(res, argv=(info.binary, "pull", "--quiet", *flags, ref)))
        pulled, _, inspected = res.text().partition("\n")
        if pulled != "pulled":
            return False   # the store had it
        await self._dig_holes(ref, inspected)
        return True

    async def commit_and_push(self, container: str, local: str, remote: str, *,
                              tls_verify: bool = True) -> str:
        """Commit ``container``'s filesystem as ``local``, push it to ``remote``
        (``HOST/REPO:TAG``) and return the pushed manifest digest.  ``local`` is removed
        again (the image stays under its digest wherever it is pulled).  The image names
        the container's sparse files in a label, for :meth:`pull` to keep them sparse
        (``remote/sparse.py``)."""
        info = await self.probe()
        holes = await self._sparse_label(container)
        change = ["--change", f"LABEL {sparse.LABEL}={holes}"] if holes else []
        res = await self._run([info.binary, "commit", "--quiet", *change, container, local], check=False,
                              timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:
            raise ContainerRuntimeError(f"could not commit {container} on {self.runner.label}: "
                                        f"{res.describe()}")
        if info.userns != "none":
            await self._shift_owners(container, local)
        script = ('d=$(mktemp) || exit 1; "$1" push --quiet --tls-verify="$2" --digestfile "$d" "$3" '
                  '"docker://$4" >&2 || { rm -f "$d"; exit 1; }; cat "$d"; rm -f "$d"')
        try:
            res = await self._run(["sh", "-c", script, "sh", info.binary, str(tls_verify).lower(), local, remote],
                                  check=False, timeout_s=max(self.config.command_timeout_s, 900.0))
        finally:
            await self._run([info.binary, "rmi", local], check=False)
        digest = res.text().strip()
        if not res.ok or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise RegistryUnavailableError(f"push of the snapshot of {container} to {remote} from "
                                           f"{self.runner.label} failed: {res.describe()}",
                                           provider=remote.split("/", 1)[0], code="PushFailed")
        return digest

    async def _sparse_label(self, container: str) -> str:
        """The label value naming ``container``'s sparse files: those of its writable layer
        (listed from the host) and those its image named; "" when none or not found."""
        info = await self.probe()
        res = await self._run([info.binary, "inspect", "--format",
                               "{{.GraphDriver.Data.UpperDir}}\n"
                               f'{{{{index .Config.Labels "{sparse.LABEL}"}}}}', container], check=False)
        upper, _, label = res.text().strip().partition("\n")
        found = b""
        if res.ok and upper.startswith("/"):
            scan = await self.runner.run(["sh", "-c", sparse.SCAN, "sh", upper],
                                         timeout_s=max(self.config.command_timeout_s, 900.0))
            found = b"" if scan.timed_out else scan.stdout     # what find could read
        return sparse.encode(sparse.sparse_paths(found), sparse.decode(label.strip()))

    async def _dig_holes(self, ref: str, inspected: str) -> None:
        """Make the files a pulled snapshot names in its label sparse again in this
        machine's store (podman wrote them in full); a failure leaves them as pulled.
        ``inspected``: the image's ``_SPARSE_FORMAT`` (empty when that inspect failed)."""
        label, _, dirs = inspected.strip().partition("\n")
        paths = sparse.decode(label.strip())
        layers = [d for d in dirs.split(":") if d.startswith("/")]
        if not paths or not layers:
            return
        dug = await self.runner.run(["sh", "-c", sparse.DIG, "sh", *layers], input=b"\0".join(paths),
                                    timeout_s=max(self.config.command_timeout_s, 900.0))
        if not dug.ok:
            log.warning("the sparse files of %s stay written in full on %s: %s", ref,
                        self.runner.label, dug.describe())

    async def _shift_owners(self, container: str, local: str) -> None:
        """Store the container's own file owners in the committed image ``local`` (podman
        stores the host ids of a user-namespaced container's files; see ``layershift``)."""
        info = await self.probe()
        res = await self._run([info.binary, "inspect", "--format",
                               "{{json .HostConfig.IDMappings}}", container])
        try:
            maps = json.loads(res.text())
            uids, gids = ",".join(maps["UidMap"] or ()), ",".join(maps["GidMap"] or ())
        except (ValueError, KeyError, TypeError) as exc:
            raise ContainerRuntimeError(f"no id map for {container} on {self.runner.label}: "
                                        f"{res.text()[:200]!r}") from exc
        if not uids or not gids:
            return
        script = ('command -v python3 >/dev/null || { echo "snapshots of a sandbox under a user-namespace '
                  'map need python3 on the instance" >&2; exit 3; }; '
                  'd=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT; '
                  '"$1" save -q --format oci-dir --uncompressed -o "$d/img" "$2" >&2 || exit 1; '
                  'python3 - "$d/img" "$3" "$4" >&2 || exit 1; '
                  'tar -C "$d/img" -cf "$d/img.tar" . && "$1" rmi "$2" >/dev/null && '
                  '"$1" load -q -i "$d/img.tar" >&2')   # as oci-archive: named by its ref.name, $2
        res = await self.runner.run(["sh", "-c", script, "sh", info.binary, local, uids, gids],
                                    input=_LAYERSHIFT.encode(),
                                    timeout_s=max(self.config.command_timeout_s, 900.0))
        if not res.ok:
            await self._run([info.binary, "rmi", local], check=False)
            raise ContainerRuntimeError(f"could not store {container}'s file owners in its snapshot on "
                                        f"{self.runner.label}: {res.describe()}")

    async def remove_image(self, ref: str) -> bool:
        """Untag ``ref`` (the image goes when its last name does); False if a container uses it."""
        info = await self.probe()
        res = await self._run([info.binary, "rmi", ref], check=False)
        return res.ok
