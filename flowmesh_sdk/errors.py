"""The one error tree of FlowMesh SDK.

Every error the SDK raises is a :class:`FlowMeshError`.  Callers decide what to do
from the class alone:

* :class:`CapacityError`  -- this offer has no capacity now: try the next offer.
* :class:`QuotaError`     -- a limit (cloud quota or tenant quota) is reached: try
  another region/provider, or wait for your own tasks to finish.
* :class:`ThrottledError` -- the API asked us to slow down: back off, same offer.
* :class:`AuthError`      -- a credential is missing or refused: stop and tell the user.
* :class:`NotFoundError`  -- the thing asked about does not exist (any more).
* :class:`SpecError`      -- bad input; the message names the field and what is allowed.

Errors raised from a lower layer chain it as ``__cause__`` (``raise ... from exc``).

The whole tree (each class is importable from ``flowmesh_sdk``; those defined next to
their part name the module)::

    FlowMeshError
    ├── SpecError (also a ValueError)          bad input: names the field and what is allowed
    ├── ProviderError                          a provider call failed (``provider``, ``code``)
    │   ├── CapacityError                      no capacity for this offer now: try the next
    │   ├── QuotaError                         a cloud or tenant limit: another region/provider, or wait
    │   ├── ThrottledError                     rate limited: back off, same offer (``retry_after_s``)
    │   ├── AuthError                          a credential is missing or refused: stop
    │   ├── NotFoundError                      the thing asked about does not exist (any more)
    │   └── ProviderUnavailableError           the API cannot be reached now: retried with backoff
    │       └── RegistryUnavailableError       an image registry cannot be reached
    ├── ImageNotFoundError                     an image that does not resolve, at dispatch
    ├── SandboxTimeout                         a command ran past its deadline (its tree was killed)
    ├── InstanceLost                           the instance went away under a task
    ├── RuntimeMissingError                    no podman/docker on a machine (says how to install)
    ├── BootstrapError                         a bootstrap step failed (``instance_id``, ``step``)
    ├── ContainerRuntimeError                  the container runtime refused a command
    │   ├── WorkerStartError                   (workers.errors) a GPU worker did not come up
    │   └── TrainingFailedError                (workers.errors) a training run failed
    ├── SandboxFileError                       a file operation inside a sandbox failed
    ├── SandboxClosedError                     the sandbox is closed
    ├── PoolClosedError                        the pool is draining or drained
    ├── LifecycleError                         an invalid lifecycle transition (a bug)
    ├── IntegrationMissingError (ImportError)  an optional integration's package is missing: names the extra
    ├── ControlPlaneUnavailableError           the shared control state (Redis) cannot be reached
    ├── BudgetExceededError                    a launch would exceed a budget (``which``, ``would_be``, ``cap``)
    ├── StoreSchemaError                       the metadata store was written by a newer FlowMesh
    ├── NoFeasibleOffer                        (bidder.gates) no offer passes the gates (each gate's count)
    ├── CasError                               (cas.base) the content-addressed store failed
    │   ├── CasNotFoundError                   no object with that digest
    │   └── CasCorruptError                    an object does not match its digest
    ├── LocalRegistryError (also a RuntimeError)  (registry.local) the local registry did not start or push
    │   └── RegistryNotInstalled               ``docker-registry`` is missing (says how to install)
    └── ImageBuildError (also a RuntimeError)  (imagebuild.build) building a project image failed

``tests/test_docs_truth.py`` checks this drawing against the classes.
"""

from __future__ import annotations

from collections.abc import Mapping

from .redaction import redact_url


class FlowMeshError(Exception):
    """Base of every error the SDK raises."""


class SpecError(FlowMeshError, ValueError):
    """Bad input: names the field, the value given and what is allowed."""

    def __init__(self, field: str, message: str, *, code: str = "", provider: str = "") -> None:
        self.field = field
        self.code = code
        self.provider = provider
        super().__init__(f"{field}: {message}")


class ProviderError(FlowMeshError):
    """A provider (cloud or local host) refused or failed a call."""

    def __init__(self, message: str, *, provider: str = "", code: str = "") -> None:
        self.provider = provider
        self.code = code
        prefix = f"[{provider}] " if provider else ""
        suffix = f" ({code})" if code else ""
        super().__init__(f"{prefix}{message}{suffix}")


class CapacityError(ProviderError):
    """No capacity for this offer now; the next offer may have some."""


class QuotaError(ProviderError):
    """A quota is exhausted (cloud account quota, or a tenant's quota in the SDK)."""


class ThrottledError(ProviderError):
    """The API is rate limiting us; retry the same call after a backoff.

    ``retry_after_s`` is the server's hint (``Retry-After``), when it gave one."""

    def __init__(self, message: str, *, provider: str = "", code: str = "",
                 retry_after_s: float | None = None) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, provider=provider, code=code)


class AuthError(ProviderError):
    """A credential is missing or refused; the message says which one to set."""

    @classmethod
    def of_each(cls, refused: Mapping[str, AuthError]) -> AuthError:
        """The one error for "no provider accepted its credentials", naming each
        provider's own error (the first chained as the cause)."""
        err = cls("no provider accepted its credentials: " + "; ".join(f"{p}: {e}" for p, e in refused.items()),
                  code="AllAuthFailed")
        err.__cause__ = next(iter(refused.values()), None)
        return err


class NotFoundError(ProviderError):
    """The instance (or other resource) does not exist."""


class ProviderUnavailableError(ProviderError):
    """The service did not answer or failed on its side (unreachable endpoint, internal
    error); retried with backoff like throttling."""


class RegistryUnavailableError(ProviderUnavailableError):
    """An image registry is down or failing (connection refused, 5xx); retried per policy."""


class ImageNotFoundError(FlowMeshError):
    """The sandbox image does not resolve; raised at dispatch, before any launch."""

    def __init__(self, image: str, detail: str = "") -> None:
        self.image = image
        super().__init__(f"image {image!r} not found" + (f": {detail}" if detail else ""))


class SandboxTimeout(FlowMeshError):
    """A sandbox operation (not a command: those return ``timed_out=True``) ran out of time."""


class InstanceLost(FlowMeshError):
    """An instance disappeared (preempted, terminated outside the SDK, unreachable);
    ``preempted``: it was a spot instance its provider reclaimed."""

    def __init__(self, message: str, *, preempted: bool = False) -> None:
        super().__init__(message)
        self.preempted = preempted


class RuntimeMissingError(FlowMeshError):
    """No usable container runtime on the machine; the message says how to install one."""


class BootstrapError(FlowMeshError):
    """A bootstrap step failed on an instance; the instance is marked failed and replaced.
    ``step`` names the step (``reach``, ``runtime``, ``registry_login``, ``prefetch``,
    ``agent``); the step's own error is the ``__cause__``."""

    def __init__(self, instance_id: str, step: str, message: str) -> None:
        self.instance_id = instance_id
        self.step = step
        super().__init__(f"instance {instance_id}: bootstrap step {step!r} failed: {message}")


class ContainerRuntimeError(FlowMeshError):
    """A container runtime command failed; the message carries the command and its stderr."""


class SandboxFileError(FlowMeshError):
    """A file could not be read from or written to a sandbox."""


class LifecycleError(FlowMeshError):
    """An invalid lifecycle transition: a bug in the caller, never a condition to retry."""


class SandboxClosedError(FlowMeshError):
    """The sandbox was closed (or its channel died) and cannot run commands."""


class PoolClosedError(FlowMeshError):
    """The pool is draining or closed and admits no new work."""


class IntegrationMissingError(FlowMeshError, ImportError):
    """An integration's package (an optional extra: ``swe-rex``, ``mini-swe-agent``, ``trl``)
    is not installed; the message names the extra to install."""


class ControlPlaneUnavailableError(FlowMeshError):
    """The shared control state (Redis, ``FLOWMESH_STATE``) cannot be reached, or this
    coordinator's lease on it was lost; ``url`` names where (without a password)."""

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(redact_url(message))
        self.url = redact_url(url)


__all__ = [
    "AuthError",
    "BootstrapError",
    "CapacityError",
    "ContainerRuntimeError",
    "ControlPlaneUnavailableError",
    "FlowMeshError",
    "ImageNotFoundError",
    "InstanceLost",
    "IntegrationMissingError",
    "LifecycleError",
    "NotFoundError",
    "PoolClosedError",
    "ProviderError",
    "ProviderUnavailableError",
    "QuotaError",
    "RegistryUnavailableError",
    "RuntimeMissingError",
    "SandboxClosedError",
    "SandboxFileError",
    "SandboxTimeout",
    "SpecError",
    "ThrottledError",
]


class StoreSchemaError(FlowMeshError):
    """The metadata store was written by a newer FlowMesh (a schema this code does not know)."""

    def __init__(self, path: str, found: int, known: int) -> None:
        self.path, self.found, self.known = path, found, known
        super().__init__(f"metadata store {path} has schema version {found}; this FlowMesh knows up to {known} "
                         "-- upgrade flowmesh-sdk, or point FLOWMESH_HOME elsewhere")


class BudgetExceededError(FlowMeshError):
    """A launch would take a pool (or fleet) past its budget: ``which`` is
    ``budget_per_hour`` or ``budget_total``, with the spend that would result and the cap."""

    def __init__(self, message: str, *, which: str, would_be: float, cap: float) -> None:
        super().__init__(message)
        self.which = which
        self.would_be = would_be
        self.cap = cap
