"""A unit of work and what became of it: :class:`Task`, :class:`ExecResult`,
:class:`PhaseTimings`, :class:`InfraFailure`, :class:`TaskResult`."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import SpecError
from .checks import ISOLATIONS, check_choice, check_number
from .provenance import Provenance, ReuseKind
from .sandbox import SandboxSpec

# validated with fullmatch: ``re.match`` with ``$`` lets a trailing newline through
_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}", re.ASCII)


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of one command in a sandbox.

    ``stdout``/``stderr`` are decoded UTF-8 (invalid bytes replaced).  When a stream
    exceeded the cap, it holds the first bytes followed by a marker line and its
    ``*_truncated`` flag is set; ``*_bytes`` is the full size the command wrote.
    """

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class Task:
    """A declarative unit of work for :meth:`Pool.map`: files in, one command, result out."""

    name: str
    sandbox: SandboxSpec
    command: str
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    timeout_s: float | None = None
    tenant: str = "default"
    # result reuse (flowmesh_sdk.reuse): a deterministic task, or one pinned by a seed, may be
    # answered from the content-addressed store; anything else always runs
    deterministic: bool = False
    seed: int | None = None
    # a mode="auto" pool: strict (a fresh instance) or shared (a fresh container on a warm
    # instance); None: the pool's default.  Not part of the task's identity.
    isolation: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or not self.name.isprintable():
            raise SpecError("task.name", f"must be a non-empty string of printable characters, got {self.name!r}")
        if not isinstance(self.sandbox, SandboxSpec):
            raise SpecError("task.sandbox", "must be a SandboxSpec (e.g. pool.default_sandbox(image) or "
                                            f"SandboxSpec(image=...)), got {self.sandbox!r}")
        if not isinstance(self.tenant, str) or not _TENANT.fullmatch(self.tenant):
            raise SpecError("task.tenant", "must be a tenant name: 1-128 of A-Z a-z 0-9 . _ @ : + -, "
                                           f"starting with a letter or digit; got {self.tenant!r}")
        if not isinstance(self.deterministic, bool):
            raise SpecError("task.deterministic", f"must be true or false, got {self.deterministic!r}")
        if self.seed is not None:
            check_number("task.seed", self.seed, lo=0, hi=2 ** 63 - 1, integer=True)
        if self.isolation is not None:
            check_choice("task.isolation", self.isolation, ISOLATIONS)
        if not isinstance(self.command, str) or not self.command.strip():
            raise SpecError("task.command", "must be a non-empty shell command")
        if "\x00" in self.command:
            raise SpecError("task.command", "must not contain NUL bytes (a shell command is a C string)")
        if self.timeout_s is not None:
            check_number("task.timeout_s", self.timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        if not isinstance(self.files, Mapping):
            raise SpecError("task.files", f"must be a mapping of absolute path -> bytes, got "
                                          f"{type(self.files).__name__}")
        for path, data in dict(self.files).items():
            if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
                raise SpecError(f"task.files[{path!r}]", "paths must be absolute, without NUL bytes")
            if not isinstance(data, (bytes, bytearray)):
                raise SpecError(f"task.files[{path!r}]", "contents must be bytes")
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))


@dataclass(frozen=True, slots=True)
class PhaseTimings:
    """Seconds a task spent in each phase (MegaFlow's breakdown)."""

    queued: float = 0.0
    scheduling: float = 0.0
    env_startup: float = 0.0
    execution: float = 0.0
    teardown: float = 0.0

    @property
    def total(self) -> float:
        return self.queued + self.scheduling + self.env_startup + self.execution + self.teardown


class InfraFailure(str, enum.Enum):
    """Why the infrastructure, not the task's own command, ended a task (docs/api.md).
    A task whose command ran to its end (any exit code, or its timeout) has none."""

    PREEMPTED = "preempted"                # its spot instance was reclaimed by the cloud
    INSTANCE_LOST = "instance_lost"        # its machine went away (heartbeat, reconcile, node or pod gone)
    IMAGE_PULL = "image_pull"              # its image did not resolve or could not be pulled
    CAPACITY = "capacity"                  # no capacity, or a cloud or tenant quota exhausted
    BUDGET = "budget"                      # a launch for it would have exceeded a budget
    COORDINATOR_LOST = "coordinator_lost"  # (shared fleet) the coordinators running it died, past its retries
    SANDBOX_START = "sandbox_start"        # its sandbox (or the machine under it) did not start
    POOL_CLOSED = "pool_closed"            # the pool was draining
    PROVIDER = "provider"                  # a provider call failed otherwise (refused credential, API down)

    @property
    def retried(self) -> bool:
        """Whether a pool dispatches a task again after this (``retry_infra_failures``)."""
        return self in (InfraFailure.PREEMPTED, InfraFailure.INSTANCE_LOST, InfraFailure.COORDINATOR_LOST)


@dataclass(frozen=True, slots=True)
class TaskResult:
    task_id: str
    name: str
    pool: str
    result: ExecResult | None
    phases: PhaseTimings
    error: str | None = None
    instance_id: str | None = None
    image_digest: str | None = None   # the image the task ran, pinned
    reuse: ReuseKind | None = None    # set when the task went through the reuse layer
    provenance: Provenance | None = None
    infra_failure: InfraFailure | None = None   # set when the infrastructure ended it (``error`` says how)
    attempts: int = 1                 # dispatches it took (0: answered without running, a reuse hit)
    cost: float = 0.0                 # $: its share of its instances' cost while it held them (docs/cost-model.md)
    run: str = ""                     # the fleet's run id (Fleet(run=...))

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None and self.result.ok
