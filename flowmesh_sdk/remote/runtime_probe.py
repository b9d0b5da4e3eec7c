"""The runtime probe of :meth:`~flowmesh_sdk.remote.runtime.ContainerRuntime.probe`: one
script (:func:`probe_script`) finds the runtime binary, asks its version and reads the host
facts its flags depend on; :func:`read_probe` turns what it printed into the
:class:`~.runtime_config.RuntimeInfo` (the flags every container of the machine gets)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..errors import RuntimeMissingError
from .runtime_args import runtime_flags, ulimit_flags
from .runtime_config import _USERNS_MAP, DEFAULT_USERNS_MAP, INSTALL_HINT, PROBE_SECTION, SHM_ARGS, RuntimeConfig, RuntimeInfo


def probe_script(wanted: Sequence[str], *, disk: bool) -> str:
    """The probe's script.  It prints the first of ``wanted`` found (nothing more when none
    is), then its version (or ``!`` and what ``version`` said when it failed), then after a
    :data:`PROBE_SECTION` line the host facts, one a line, and with ``disk`` after another
    the storage driver and its filesystem (a podman disk quota needs overlay on xfs)."""
    find = " || ".join(f"command -v {shlex.quote(b)}" for b in wanted)
    version = """"$p" version --format '{{.Client.Version}}'"""
    script = (f'p=$({find}) || exit 0; echo "$p"; '
              f'v=$({version} 2>/dev/null) && echo "$v" || {{ echo "!"; {version} 2>&1 | tail -n 5; exit 0; }}; '
              f"echo {PROBE_SECTION}; "
              "grep CapEff /proc/self/status | awk '{print $2}'; ulimit -Hn; "
              "[ -e /sys/fs/cgroup/cgroup.controllers ] && echo v2 || echo v1; "
              "command -v runc || echo; id -u; cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0; "
              "grep -c '^containers:' /etc/subuid 2>/dev/null || true; "
              "command -v nsenter >/dev/null && command -v ip >/dev/null && echo netns || echo; "
              "command -v nft >/dev/null && echo nft || echo; "
              "command -v runsc >/dev/null && echo runsc || echo")
    if disk:
        script += (f'; echo {PROBE_SECTION}; [ "${{p##*/}}" = podman ] && "$p" info --format '
                   """'{{.Store.GraphDriverName}} {{index .Store.GraphStatus "Backing Filesystem"}}' """
                   "2>/dev/null || true")
    return script


def read_probe(out: str, cfg: RuntimeConfig, wanted: Sequence[str], where: str) -> RuntimeInfo:
    """What :func:`probe_script` printed on ``where`` (a runner's label), as the flags
    ``cfg`` asks for on that machine; :class:`RuntimeMissingError` when no runtime works."""
    found, _, rest = out.partition("\n")
    if not found.strip():
        raise RuntimeMissingError(f"no container runtime ({' or '.join(wanted)}) on {where}: {INSTALL_HINT}")
    binary = found.strip().rsplit("/", 1)[-1]
    version, _, rest = rest.partition("\n")
    if version == "!":   # `version` failed: what it said follows
        raise RuntimeMissingError(f"`{binary}` does not work on {where} (`{binary} version` "
                                  f"failed: {rest.strip()[-500:] or 'no output'}); {INSTALL_HINT}")
    facts, _, disk = rest.partition(f"{PROBE_SECTION}\n")[2].partition(f"{PROBE_SECTION}\n")
    lines = facts.split("\n")
    cap_hex, hard_nofile, cgroups, runc, uid, max_userns, subuid, netns, nft, runsc = (lines + [""] * 10)[:10]
    flags = runtime_flags(cfg.oci_runtime, binary=binary, cgroups_v2=cgroups == "v2",
                          has_runc=runc.strip() != "")
    if cfg.ulimits is not None:
        for u in cfg.ulimits:
            flags += ["--ulimit", u]
    else:
        try:
            caps: int | None = int(cap_hex.strip(), 16)
        except ValueError:
            caps = None
        flags += ulimit_flags(caps, hard_nofile)
    flags += list(cfg.extra_run_args)
    sandbox: list[str] = []
    if cfg.capabilities is not None:
        sandbox.append("--cap-drop=all")
        if cfg.capabilities:
            sandbox.append("--cap-add=" + ",".join(cfg.capabilities))
    if cfg.no_new_privileges:
        sandbox += ["--security-opt", "no-new-privileges"]
    userns = "none"
    if cfg.userns == "podman-auto" or (cfg.userns == "auto" and binary == "podman"
                                       and uid.strip() == "0" and subuid.strip() not in ("", "0")):
        sandbox.append("--userns=auto")
        userns = "auto"
    elif cfg.userns == "auto" and binary == "podman" and uid.strip() == "0" \
            and max_userns.strip().isdigit() and int(max_userns) > 0:
        userns = DEFAULT_USERNS_MAP
    elif _USERNS_MAP.fullmatch(cfg.userns):
        userns = cfg.userns
    if userns not in ("none", "auto"):
        sandbox += ["--uidmap", userns, "--gidmap", userns]
    sandbox += SHM_ARGS
    quota = False
    if cfg.disk_limit_mb is not None:
        quota = binary == "podman" and disk.split()[:2] == ["overlay", "xfs"]
        if quota:
            sandbox += ["--storage-opt", f"size={cfg.disk_limit_mb}m"]
        sandbox += ["--ulimit", f"fsize={cfg.disk_limit_mb << 20}"]
    return RuntimeInfo(binary, version.strip(), cgroups, tuple(flags), tuple(sandbox),
                       userns, quota, netns.strip() == "netns", nft.strip() == "nft",
                       runsc.strip() == "runsc")


__all__ = ["probe_script", "read_probe"]
