"""Pure command-building for the container runtime: the ``--runtime`` and ``--ulimit``
flags a host needs (:func:`runtime_flags`, :func:`ulimit_flags`; imagebuild applies the
same rules), a gVisor sandbox's flags (:func:`gvisor_run_args`), the nft rules that refuse
traffic, and the mapping of a failed ``pull`` to the SDK's errors (:func:`pull_error`).
Nothing here runs a command.  Re-exported from :mod:`.runtime`, where it was defined first.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import AuthError, ImageNotFoundError, RegistryUnavailableError, ThrottledError
from .runner import CommandResult
from .runtime_config import _CAP_SYS_RESOURCE, GVISOR_BASE_TASKS, GVISOR_TASKS_PER_PROCESS


def runtime_flags(oci_runtime: str, *, binary: str, cgroups_v2: bool, has_runc: bool) -> list[str]:
    """The ``--runtime`` flag every podman command that starts a container gets (``run``,
    and ``build`` for its RUN steps: imagebuild uses this too).  ``auto``: runc on
    cgroups v1 when it is installed, since crun (podman's first choice once installed)
    refuses hybrid cgroups; ``default``: nothing; anything else is passed as it is."""
    if oci_runtime == "auto":
        return ["--runtime", "runc"] if binary == "podman" and not cgroups_v2 and has_runc else []
    return [] if oci_runtime == "default" else ["--runtime", oci_runtime]


def gvisor_run_args(run_flags: Sequence[str], pids: int) -> tuple[list[str], int]:
    """``run_flags`` for a gVisor sandbox, and the host pids limit it gets.

    The probe's ``--runtime`` gives way to runsc with ``network=none``: gVisor serves only
    its own loopback (SandboxSpec refuses other networks under gVisor; docs/security.md
    says why).  The sandbox's ``pids`` limit is its processes; on the host, gVisor's
    sentry, gofer and per-process stubs are counted instead (:data:`GVISOR_TASKS_PER_PROCESS`),
    so the host limit is set above them and the agent applies ``pids`` inside, as
    RLIMIT_NPROC, which gVisor's kernel counts over the sandbox alone."""
    out: list[str] = []
    flags = list(run_flags)
    i = 0
    while i < len(flags):
        if flags[i] == "--runtime":
            i += 2
            continue
        if not flags[i].startswith("--runtime="):
            out.append(flags[i])
        i += 1
    return ["--runtime", "runsc", "--runtime-flag", "network=none", *out], \
        GVISOR_BASE_TASKS + GVISOR_TASKS_PER_PROCESS * pids


def ulimit_flags(cap_eff: int | None, hard_nofile: str) -> list[str]:
    """``--ulimit`` pins for a host without CAP_SYS_RESOURCE (``cap_eff``: the CapEff mask,
    None when unknown): the runtime cannot raise RLIMIT_NOFILE/NPROC to podman's
    defaults there, so nofile is pinned to at most the host's hard limit."""
    if cap_eff is None or cap_eff >> _CAP_SYS_RESOURCE & 1:
        return []
    n = 4096
    if hard_nofile.strip().isdigit():
        n = min(n, int(hard_nofile.strip()))
    return ["--ulimit", f"nofile={n}:{n}", "--ulimit", "nproc=4096:4096"]



def pull_error(ref: str, where: str, res: CommandResult) -> Exception:
    """Map a failed ``pull`` to the SDK's error classes by what the runtime printed."""
    err = res.stderr.decode("utf-8", "replace")
    low = err.lower()
    registry = ref.split("/", 1)[0]
    msg = f"pull of {ref} on {where} failed: {res.describe()}"
    if "toomanyrequests" in low or "too many requests" in low:
        return ThrottledError(msg, provider=registry, code="TooManyRequests")
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        return AuthError(f"registry {registry} refused the pull of {ref}; log in with "
                         f"`podman login {registry}` ({res.describe()})", provider=registry,
                         code="Unauthorized")
    if "manifest unknown" in low or "name unknown" in low or "not found" in low:
        return ImageNotFoundError(ref, f"{where}: {res.describe()}")
    if "digest" in low and ("mismatch" in low or "did not match" in low):
        return RegistryUnavailableError(f"{msg} (a layer failed its digest check; not used)",
                                        provider=registry, code="DigestMismatch")
    return RegistryUnavailableError(msg, provider=registry, code="PullFailed")
