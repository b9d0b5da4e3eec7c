"""A TEST FIXTURE: what a test session leaves running or lying around on this machine.

:func:`begin` tags the session: a fresh token in ``os.environ[SESSION_VAR]`` is inherited by
every process the session starts (sshd hosts, registries, podman and its conmon, ...) and
:class:`~flowmesh_sdk.testing.sshd.LoopbackSshd` writes it into its sessions' environment,
so podman started over SSH carries it too.  :func:`leftovers` then lists, at the end:

* processes carrying the token, and their descendants (a container's processes are its
  conmon's children and have the container's environment);
* containers under a storage root a fixture made (:data:`STORES`), and containers with
  ``flowmesh.*`` labels created in the machine's default podman storage during the session;
* temporary directories and files with the SDK's prefixes (:data:`TEMP_PREFIXES`) made
  during it (a worker's engine log, ``/tmp/flowmesh-engine-NAME.log``, is a file).

What another test session still running on this machine may own (a directory made meanwhile
by a process that is not ours) is listed apart, as ``unsure``.  :func:`clean` removes what
:func:`leftovers` found.  The process and store helpers are what ``LoopbackSshd`` uses to
end a host's processes and containers before it deletes the host's storage.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SESSION_VAR = "FLOWMESH_TEST_SESSION"
#: ``mkdtemp`` prefixes of the SDK, its fixtures and its tests (``fm-sshd-``,
#: ``flowmesh-registry-``, ``fm-cloudinit-``, ``fm-run-``, ...; mini-swe-agent's config dir)
TEMP_PREFIXES = ("fm-", "flowmesh-", "mswea-config-")
#: container storage roots (``storage.conf`` and ``containers.conf`` inside) that fixtures
#: of this process made and have not wiped yet
STORES: set[Path] = set()


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    cmdline: str
    environ: bytes

    def __str__(self) -> str:
        what = self.cmdline[:200] or f"[{self.comm}]"
        if self.comm == "conmon":   # its command line runs to kilobytes: the container and its store
            args = self.cmdline.split()
            opt = {a: b for a, b in zip(args, args[1:]) if a in ("-c", "-n", "-b")}
            what = (f"conmon of container {opt.get('-n', '?')} ({opt.get('-c', '?')[:12]}) "
                    f"stored in {opt.get('-b', '?').partition('/overlay-containers/')[0]}")
        return f"pid {self.pid} (ppid {self.ppid}): {what}"


def processes() -> dict[int, Proc]:
    """Every live (not zombie) process on this machine whose details can be read."""
    out: dict[int, Proc] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            environ = Path(entry.path, "environ").read_bytes()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:   # gone meanwhile, or a kernel thread's unreadable bits
            continue
        comm, _, rest = stat.partition(" (")[2].rpartition(") ")
        fields = rest.split()
        if not fields or fields[0] in ("Z", "X"):
            continue
        out[int(entry.name)] = Proc(int(entry.name), int(fields[1]), comm,
                                    cmdline.replace(b"\0", b" ").decode("utf-8", "replace").strip(),
                                    b"\0" + environ)
    return out


def tagged(procs: Mapping[int, Proc], needle: str) -> set[int]:
    """Pids whose environment holds ``needle`` (``VAR=value`` or ``=value...``)."""
    raw = needle.encode()
    return {p.pid for p in procs.values() if raw in p.environ}


def with_descendants(procs: Mapping[int, Proc], roots: Iterable[int]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for p in procs.values():
        kids.setdefault(p.ppid, []).append(p.pid)
    seen: set[int] = set()
    todo = [r for r in roots if r in procs]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += kids.get(pid, [])
    return seen


def _links(pid: int) -> list[str]:
    """Where ``pid``'s cwd and open files are."""
    out = []
    for link in [f"/proc/{pid}/cwd"] + [f"/proc/{pid}/fd/{fd}" for fd in _listdir(f"/proc/{pid}/fd")]:
        try:
            out.append(os.readlink(link))
        except OSError:   # closed meanwhile
            pass
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def users_of(procs: Mapping[int, Proc], paths: Iterable[Path]) -> dict[Path, int]:
    """For each of ``paths`` that one of ``procs`` uses (its cwd or an open file is in it,
    or its command line or environment names it), one such pid."""
    out: dict[Path, int] = {}
    todo = {str(p): p for p in paths}
    for proc in procs.values():
        if not todo:
            break
        links = _links(proc.pid)
        for text, path in list(todo.items()):
            if (text.encode() in proc.environ or text in proc.cmdline
                    or any(w == text or w.startswith(text + "/") for w in links)):
                out[path] = proc.pid
                del todo[text]
    return out


def ancestors(procs: Mapping[int, Proc], pid: int) -> set[int]:
    out: set[int] = set()
    while pid in procs and pid not in out:
        out.add(pid)
        pid = procs[pid].ppid
    return out


def kill(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` (never this process or one of its ancestors)."""
    lineage = ancestors(processes(), os.getpid())
    for pid in set(pids) - lineage:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pids: Iterable[int], timeout_s: float) -> set[int]:
    """Wait (on pidfds: an event per exit) until ``pids`` have exited; returns those still
    alive at the deadline.  Works for processes that are not our children."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    try:
        pending = set(fds)
        while pending:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                break
            for fd, _ in poller.poll(left_ms):
                poller.unregister(fd)
                pending.discard(fd)
        return {fds[fd] for fd in pending}
    finally:
        for fd in fds:
            os.close(fd)


# ---- container stores ------------------------------------------------------------
def store_env(root: Path | None) -> dict[str, str]:
    """The environment a podman needs to see the store at ``root`` exactly as the sessions
    of its host do (``--root``/``--runroot``/``--tmpdir`` alone do not: podman refuses a
    store whose recorded volume path differs -- "database configuration mismatch").
    ``None``: the machine's default storage."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF")}
    if root is not None:
        env.update(CONTAINERS_STORAGE_CONF=str(root / "storage.conf"), CONTAINERS_CONF=str(root / "containers.conf"))
    return env


def podman(root: Path | None, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=store_env(root), capture_output=True, text=True,
                          timeout=timeout_s, check=False)


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    state: str
    created: float        # unix time
    pid: int              # its init's pid, 0 when not running
    labels: Mapping[str, str]

    def __str__(self) -> str:
        return f"{self.id[:12]} {self.name} {self.state}"


def containers(root: Path | None) -> list[Container]:
    """Every container in the store at ``root`` (None: the machine's default storage);
    raises if podman fails."""
    res = podman(root, "ps", "-a", "--format", "json")
    if res.returncode != 0:
        raise RuntimeError(f"podman ps in {root or 'the default storage'}: {res.stderr.strip()}")
    out = []
    for row in json.loads(res.stdout or "[]") or []:
        names = row.get("Names") or ["?"]
        out.append(Container(str(row.get("Id", "")), str(names[0] if isinstance(names, list) else names),
                             str(row.get("State", "")), float(row.get("Created") or 0), int(row.get("Pid") or 0),
                             {str(k): str(v) for k, v in (row.get("Labels") or {}).items()}))
    return out


def conmons_of(procs: Mapping[int, Proc], path: Path) -> set[int]:
    """conmon processes of containers stored under ``path`` (their command lines name it)."""
    return {p.pid for p in procs.values() if p.comm == "conmon" and f" {path}/" in p.cmdline}


def unmount_under(path: Path) -> None:
    """Unmount every mount at or below ``path`` (overlay homes, container shm), deepest first."""
    prefix = str(path).rstrip("/") + "/"
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for m in sorted({m for m in mounts if (m + "/").startswith(prefix)}, key=len, reverse=True):
        subprocess.run(["umount", m], capture_output=True, check=False)


# ---- a session -------------------------------------------------------------------
def _temp_roots() -> list[Path]:
    return sorted({Path(tempfile.gettempdir()), Path("/var/tmp")})   # imagebuild works in /var/tmp


def _temp_entries() -> set[Path]:
    out: set[Path] = set()
    for root in _temp_roots():
        try:
            out |= {Path(e.path) for e in os.scandir(root)
                    if e.name.startswith(TEMP_PREFIXES)
                    and (e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False))}
        except OSError:
            pass
    return out


@dataclass(frozen=True)
class Session:
    token: str
    started: float                 # time.time() at begin
    temp_before: frozenset[Path]
    others_at_start: tuple[str, ...]   # other test sessions running then


def _other_sessions(procs: Mapping[int, Proc], ours: set[int], lineage: set[int],
                    outer: set[str]) -> list[Proc]:
    """Processes of other test sessions: a pytest, or a process tagged by a session that is
    neither this one nor one this one runs inside."""
    return [p for p in procs.values() if p.pid not in ours and p.pid not in lineage
            and (("pytest" in p.cmdline and "python" in p.cmdline)
                 or (SESSION_VAR.encode() + b"=" in p.environ
                     and not any(f"\0{SESSION_VAR}={t}\0".encode() in p.environ for t in outer)))]


def _outer_tags(procs: Mapping[int, Proc], lineage: set[int]) -> set[str]:
    """The tags of the sessions this one runs inside (an outer pytest that started this one)."""
    return {e.split(b"=", 1)[1].decode() for pid in lineage for e in procs[pid].environ.split(b"\0")
            if e.startswith(SESSION_VAR.encode() + b"=")}


#: temporary directories with the prefixes that this process made since :func:`begin`
MADE: set[Path] = set()


def _note_mkdir(event: str, args: tuple[object, ...]) -> None:
    if event == "os.mkdir" and isinstance(args[0], (str, Path)):
        path = Path(args[0])
        if path.name.startswith(TEMP_PREFIXES) and path.parent in _ROOTS:
            MADE.add(path)


_ROOTS: frozenset[Path] = frozenset()


def begin() -> Session:
    """Tag this process's environment (so every process it starts from now on carries the
    tag), note what is already there, and from now on record the temporary directories this
    process makes (an audit hook on ``os.mkdir``, which ``tempfile.mkdtemp`` calls)."""
    global _ROOTS
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    os.environ[SESSION_VAR] = token
    if not _ROOTS:
        _ROOTS = frozenset(_temp_roots())
        sys.addaudithook(_note_mkdir)
    procs = processes()
    lineage = ancestors(procs, os.getpid())
    others = _other_sessions(procs, set(), lineage, _outer_tags(procs, lineage))
    return Session(token, time.time(), frozenset(_temp_entries()), tuple(p.cmdline[:100] for p in others))


@dataclass
class Leftovers:
    processes: list[Proc] = field(default_factory=list)
    containers: list[tuple[Path | None, Container]] = field(default_factory=list)   # (its store, it)
    unlisted: list[str] = field(default_factory=list)   # stores whose containers podman could not list
    dirs: list[Path] = field(default_factory=list)
    unsure: list[str] = field(default_factory=list)   # another session's, maybe

    def __bool__(self) -> bool:
        return bool(self.processes or self.containers or self.unlisted or self.dirs)

    def lines(self) -> list[str]:
        return ([f"process {p}" for p in self.processes]
                + [f"container {c} in {store or 'the default storage'}" for store, c in self.containers]
                + [f"store {u}" for u in self.unlisted]
                + [f"{'directory' if d.is_dir() else 'file'} {d}" for d in self.dirs])


def _owner_pid(label: str) -> int | None:
    parts = label.rsplit("/", 2)   # flowmesh.owner is host/pid/start (flowmesh_sdk.config.Owner)
    if len(parts) == 3 and parts[0] == socket.gethostname() and parts[1].isdigit():
        return int(parts[1])
    return None


def leftovers(session: Session) -> Leftovers:
    procs = processes()
    me = os.getpid()
    lineage = ancestors(procs, me)
    tagged_ours = with_descendants(procs, tagged(procs, f"\0{SESSION_VAR}={session.token}\0") | {me})
    others = {p: procs[p] for p in procs if p not in tagged_ours and p not in lineage}
    # what another session made meanwhile cannot be told from what a subprocess of ours made
    foreign = bool(session.others_at_start
                   or _other_sessions(procs, tagged_ours, lineage, _outer_tags(procs, lineage)))
    found = Leftovers()

    # directories: ours if this process made them or a host's store of ours is in them; one
    # a subprocess made is ours unless another process uses it or another session ran
    new_dirs = sorted(_temp_entries() - session.temp_before)
    exact = {d for d in new_dirs if d in MADE or any(s.parent == d for s in STORES)}
    used = users_of(others, [d for d in new_dirs if d not in exact])
    for d in new_dirs:
        if d in exact or not foreign and d not in used:
            found.dirs.append(d)
        else:
            by = f"pid {used[d]} uses it" if d in used else "another test session ran"
            found.unsure.append(f"directory {d} ({by})")
    stores = set(STORES) | {d / "containers" for d in found.dirs if (d / "containers" / "containers.conf").is_file()}

    ours = tagged_ours | {c for root in stores for c in conmons_of(procs, root)}
    ours = with_descendants(procs, ours) - lineage
    found.processes = [procs[p] for p in sorted(ours)]
    for root in sorted(stores):
        if (root / "containers.conf").is_file():
            try:
                found.containers += [(root, c) for c in containers(root)]
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                found.unlisted.append(f"{root}: {exc}")
    try:
        default = containers(None) if shutil.which("podman") else []
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        default = []
        found.unlisted.append(f"the default storage: {exc}")
    for c in default:
        if c.created < session.started - 1 or not any(k.startswith("flowmesh.") for k in c.labels):
            continue
        conmon = procs[c.pid].ppid if c.pid in procs else None
        owner = _owner_pid(c.labels.get("flowmesh.owner", ""))
        if conmon in ours or owner in ours or owner == me:
            found.containers.append((None, c))
        elif conmon in procs or owner in procs:
            continue   # a live process that is not ours runs it
        elif foreign:
            found.unsure.append(f"container {c} in the default storage (another test session ran)")
        else:
            found.containers.append((None, c))
    return found


def clean(found: Leftovers) -> None:
    """Remove what :func:`leftovers` found: containers (with podman, in their stores), then
    the processes still left, then the directories."""
    for store in sorted({s for s, _ in found.containers}, key=str):
        ids = [c.id for s, c in found.containers if s == store]
        if ids:
            podman(store, "rm", "-f", "-t", "0", "--ignore", *ids)
    kill(p.pid for p in found.processes)
    wait_gone((p.pid for p in found.processes), 10)
    for d in found.dirs:
        if not d.is_dir():
            d.unlink(missing_ok=True)
            continue
        if (d / "containers" / "containers.conf").is_file():
            podman(d / "containers", "rmi", "-af")
        unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
