"""Bringing a running machine to READY: five idempotent steps, each timed.

1. ``reach``           -- wait for the machine to answer (for SSH: a TCP probe for sshd's
                          banner, then ``true`` over the pinned connection);
2. ``runtime``         -- podman or docker present and working; where missing, installed with
                          :attr:`BootstrapPolicy.install_command` when ``install_runtime`` is
                          on, else a clear :class:`~flowmesh_sdk.errors.BootstrapError`;
3. ``registry_login``  -- the fleet's credentials for each registry of the warm images copied
                          to the machine as a 0600 auth file (only when its content differs);
4. ``prefetch``        -- the warm images pulled through the registry budget (single-flight);
5. ``agent``           -- a held-open ``sh`` channel answers (what every sandbox speaks over).

An instance that is a container (:mod:`flowmesh_sdk.remote.direct`) has only ``reach``:
the platform started it from the task's image, and the sandbox's own shell is its agent.

Each step reports ``changed``: a second bootstrap of a machine that is already set up
changes nothing (no install, no upload, no pull).  A failed step fails the instance (it is
terminated and replaced by the pool, never used); the report goes out on the event bus
with ``instance.ready`` (or ``instance.failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import clock, timers
from ..errors import BootstrapError, FlowMeshError, RuntimeMissingError, SpecError
from ..images import ImageInfo
from ..observe.tracing import traced
from ..remote.direct import InstanceRuntime
from ..specs import BootstrapReport, BootstrapStep, check_number
from .images import InstanceImages
from .instance import ManagedInstance

DEFAULT_INSTALL = (
    "if command -v apt-get >/dev/null 2>&1; then "
    "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq podman runc; "
    "elif command -v dnf >/dev/null 2>&1; then dnf install -y -q podman; "
    "elif command -v yum >/dev/null 2>&1; then yum install -y -q podman; "
    "else echo 'neither apt-get, dnf nor yum found' >&2; exit 1; fi")

AUTH_DIR = ".config/flowmesh/auth"   # under the login user's home on the machine


@dataclass(frozen=True, slots=True)
class BootstrapPolicy:
    """How far bootstrap may go on a machine.

    ``install_runtime``: install podman where no runtime is found (with ``install_command``,
    run as the login user -- root on the VMs the fleet launches); off, a machine without one
    fails its ``runtime`` step with a message saying what to install.
    ``reach_timeout_s``: how long a fresh machine may take to answer.
    """

    install_runtime: bool = True
    install_command: str = DEFAULT_INSTALL
    install_timeout_s: float = 900.0
    reach_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        check_number("bootstrap.install_timeout_s", self.install_timeout_s, lo=0, lo_open=True)
        check_number("bootstrap.reach_timeout_s", self.reach_timeout_s, lo=0, lo_open=True)
        if not isinstance(self.install_command, str) or not self.install_command.strip():
            raise SpecError("bootstrap.install_command", "must be a non-empty shell command")


class RegistryLogins:
    """The fleet's registry credentials, where each machine's runtime can read them: this
    host's auth file for local runners, an uploaded 0600 copy on a remote machine."""

    def __init__(self, authfile_for: Callable[[str], str | None]) -> None:
        self.authfile_for = authfile_for

    async def authfile(self, mi: ManagedInstance, registry: str) -> str | None:
        path, _ = await self.ensure(mi, registry)
        return path

    async def ensure(self, mi: ManagedInstance, registry: str) -> tuple[str | None, bool]:
        """(the auth file's path on ``mi`` or None without credentials, whether it was
        written now)."""
        local = self.authfile_for(registry)
        if local is None:
            return None, False
        runner = mi.runtime.runner
        if runner.on_this_host:
            return local, False
        if registry in mi.authfiles:
            return mi.authfiles[registry], False
        data = await asyncio.to_thread(Path(local).read_bytes)
        want = hashlib.sha256(data).hexdigest()
        name = "".join(c if c.isalnum() else "_" for c in registry) + ".json"
        script = (f'umask 077; mkdir -p "$HOME/{AUTH_DIR}" && cd "$HOME/{AUTH_DIR}" && pwd && '
                  f"(sha256sum {shlex.quote(name)} 2>/dev/null || true)")
        res = await runner.run(["sh", "-c", script], timeout_s=60)
        if not res.ok:
            raise BootstrapError(mi.id, "registry_login", f"cannot prepare {AUTH_DIR}: {res.describe()}")
        lines = res.text().split("\n")
        remote = f"{lines[0].strip()}/{name}"
        changed = not (len(lines) > 1 and lines[1].split(" ")[0] == want)
        if changed:
            tmp = f"{remote}.tmp"
            await runner.put_file(local, tmp)
            moved = await runner.run(["sh", "-c", f"chmod 600 {shlex.quote(tmp)} && mv -f "
                                                  f"{shlex.quote(tmp)} {shlex.quote(remote)}"],
                                     timeout_s=60)
            if not moved.ok:
                raise BootstrapError(mi.id, "registry_login", f"cannot install the auth file: "
                                                              f"{moved.describe()}")
        mi.authfiles[registry] = remote
        return remote, changed


class Bootstrapper:
    """Runs the steps on one instance and returns the timed report (raises
    :class:`BootstrapError` naming the failed step)."""

    def __init__(self, policy: BootstrapPolicy, logins: RegistryLogins, images: InstanceImages) -> None:
        self.policy = policy
        self.logins = logins
        self.images = images

    @traced("flowmesh.bootstrap", lambda _self, mi, *_a, **_k: {"instance": mi.id})
    async def run(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> BootstrapReport:
        # the steps are methods, not closures made per instance: a coordinator bootstraps
        # thousands of machines, each holding its bootstrap across a boot (issue 29)
        plan = _DIRECT_PLAN if isinstance(mi.runtime, InstanceRuntime) else _PLAN
        steps: list[BootstrapStep] = []
        for name, fn in plan:
            t0 = clock.monotonic()
            try:
                changed, detail = await fn(self, mi, warm)
            except BootstrapError:
                raise
            except (FlowMeshError, OSError, asyncio.TimeoutError) as exc:
                raise BootstrapError(mi.id, name, f"{type(exc).__name__}: {exc}") from exc
            steps.append(BootstrapStep(name, clock.monotonic() - t0, changed, detail))
        return BootstrapReport(mi.id, tuple(steps))

    async def _reach(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> tuple[bool, str]:
        await mi.runtime.runner.wait_reachable(self.policy.reach_timeout_s)
        return False, mi.runtime.runner.label

    async def _runtime(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> tuple[bool, str]:
        try:
            info = await mi.runtime.probe()
            return False, f"{info.binary} {info.version}"
        except RuntimeMissingError as exc:
            if not self.policy.install_runtime:
                raise BootstrapError(mi.id, "runtime", f"{exc} (install_runtime is off, so "
                                                       "nothing was installed)") from exc
        res = await mi.runtime.runner.run(["sh", "-c", self.policy.install_command],
                                          timeout_s=self.policy.install_timeout_s)
        if not res.ok:
            raise BootstrapError(mi.id, "runtime", f"no container runtime, and installing one "
                                                   f"failed: {res.describe()}")
        try:
            info = await mi.runtime.probe()
        except RuntimeMissingError as exc:
            raise BootstrapError(mi.id, "runtime", f"the install command ran but there is "
                                                   f"still no runtime: {exc}") from exc
        return True, f"installed {info.binary} {info.version}"

    async def _login(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> tuple[bool, str]:
        wrote = []
        for registry in sorted({i.registry for i in warm if i.registry}):
            path, changed = await self.logins.ensure(mi, registry)
            if changed:
                wrote.append(registry)
        return bool(wrote), f"wrote {', '.join(wrote)}" if wrote else ""

    async def _prefetch(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> tuple[bool, str]:
        if not warm:
            return False, ""
        if len(warm) == 1:   # the common case: awaited here, no gather (and no task) around it
            got = [await self.images.ensure(mi, warm[0])]
        else:
            got = list(await asyncio.gather(*(self.images.ensure(mi, info) for info in warm)))
        fetched = sum(c.fetched for c in got)
        return fetched > 0, f"{fetched} of {len(got)} pulled"

    async def _agent(self, mi: ManagedInstance, warm: Sequence[ImageInfo]) -> tuple[bool, str]:
        chan = await mi.runtime.runner.open_channel(["sh"])
        try:
            await chan.write(b"echo fm-agent-ok\n")
            async with timers.timeout(30):
                line = await chan.readline()
        finally:
            await chan.close()
        if line.strip() != b"fm-agent-ok":
            raise BootstrapError(mi.id, "agent", f"the shell channel answered {line[:80]!r}")
        return False, ""


_Step = Callable[[Bootstrapper, ManagedInstance, Sequence[ImageInfo]], Awaitable[tuple[bool, str]]]
_PLAN: tuple[tuple[str, _Step], ...] = (
    ("reach", Bootstrapper._reach), ("runtime", Bootstrapper._runtime), ("registry_login", Bootstrapper._login),
    ("prefetch", Bootstrapper._prefetch), ("agent", Bootstrapper._agent))
# the instance is the sandbox's container, started from its image by the platform: no
# runtime, login or pull on it, and its first shell is the sandbox's own
_DIRECT_PLAN = _PLAN[:1]
