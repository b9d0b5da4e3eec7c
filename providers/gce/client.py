"""google-cloud-compute clients (REST transport), driven off the event loop.

Facts checked against the installed library (google-cloud-compute 1.57, google-api-core
2.44; 2026-12-01) and what the driver does about each:

* There is no async REST client: every call runs in the bounded thread pool of a
  :class:`~flowmesh_sdk.offloop.OffLoop` (``max_workers``); nothing blocks the event loop,
  not even making a client.
* ``InstancesClient(credentials=..., client_options=ClientOptions(api_endpoint=URL))``
  talks REST to ``URL`` (``http://127.0.0.1:PORT`` for the emulator,
  ``AnonymousCredentials``); int64 fields travel as JSON strings.
* The library's own retries are switched off: every call passes ``retry=None`` (``get``
  and ``list`` otherwise retry 503s for up to 600 s on their own) and a ``timeout``.
  Retries, rate limits and failover wrap the provider contract from outside
  (:mod:`flowmesh_sdk.provisioning`).
* Mutating calls use the ``*_unary`` methods, which return the raw ``Operation``; the
  driver waits on it with its own ``ZoneOperationsClient`` built with the same options
  (:meth:`GceClient.wait`, ``zoneOperations.wait`` in rounds of at most 60 s until
  ``DONE`` or the deadline).  ``ExtendedOperation.result()`` is never used: it polls
  through an internally built operations client that ignores the client options and goes
  to the public endpoint.

Credentials: Application Default Credentials (``google.auth.default()``, in a worker
thread, on the first call) unless ``credentials`` were given.  They are never logged or
shown in a repr.

Published rate limits (rate quotas are per project and per minute, per group of methods;
exceeding one answers 403 ``rateLimitExceeded``; "Compute Engine rate quotas",
https://cloud.google.com/compute/api-quota; bulk inserts: at most 20 requests a second
and 10 bulk operations running at once, "Troubleshooting bulk VM creation",
https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-bulk-vm-creation).
:data:`RATES` declares conservative buckets inside those: launch (``bulkInsert``) 10 at
1/s (the 10 concurrent bulk operations), terminate (``delete``, one call per instance)
20 at 10/s, describe and list 20 at 5/s each (read requests of the project's per-minute
group).  The simulator's profile (``flowmesh_sdk.catalog.profiles``) models the 1,500
requests/min group.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flowmesh_sdk import redaction
from flowmesh_sdk.errors import FlowMeshError, ProviderError, ProviderUnavailableError
from flowmesh_sdk.offloop import OffLoop
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.redaction import redact_url

from .errors import PROVIDER, map_api_error, map_operation_error, missing_credentials, unreachable

log = logging.getLogger("flowmesh.providers.gce")
T = TypeVar("T")

MAX_LAUNCH_BATCH = 1000            # bulkInsert ``count`` per request (see provider.py)
CALL_TIMEOUT_S = 60.0              # one HTTP call
WAIT_ROUND_S = 60.0                # one zoneOperations.wait round (the server answers within 2 min)

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=1.0, burst=10),
    ApiRate("terminate", rate_per_s=10.0, burst=20),
    ApiRate("describe", rate_per_s=5.0, burst=20),
    ApiRate("list", rate_per_s=5.0, burst=20),
)
_INSTALL_HINT = "the gce provider needs google-cloud-compute: pip install 'flowmesh-sdk[gce]'"

# The metadata ``user-data`` value carries a secret in SSH mode (the instance's private host
# key, flowmesh_sdk/remote/cloudinit.py).  At DEBUG level the generated REST transports log
# every request and response payload (google-cloud-compute 1.57: ``_LOGGER.debug(...,
# extra={"httpRequest": {"payload": JSON}})`` and ``httpResponse``), and a structured-log
# handler would print them.  A filter on those loggers blanks the value in the message and
# in the payloads before any handler sees the record.
_USER_DATA = re.compile(r'("key"\s*:\s*"user-data"\s*,\s*"value"\s*:\s*")(?:[^"\\]|\\.)*(")')
_USER_DATA_REV = re.compile(r'("value"\s*:\s*")(?:[^"\\]|\\.)*("\s*,\s*"key"\s*:\s*"user-data")')
_REDACTED_SERVICES = ("instances", "zone_operations", "machine_types")
_REDACTED_MODULES = ("client", "transports.rest", "transports.rest_base")


def _redact(text: str) -> str:
    return _USER_DATA_REV.sub(r"\1<redacted>\2", _USER_DATA.sub(r"\1<redacted>\2", text))


def install_log_redaction() -> None:
    """Put the user-data redaction filter on the Compute clients' loggers (once)."""
    redaction.install([f"google.cloud.compute_v1.services.{svc}.{mod}" for svc in _REDACTED_SERVICES
                       for mod in _REDACTED_MODULES], "gce-user-data", _redact, trigger="user-data",
                      extras=("httpRequest", "httpResponse"))


def _import() -> Any:
    try:
        from google.cloud import compute_v1
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ProviderError(_INSTALL_HINT, provider=PROVIDER, code="MissingDependency") from exc
    return compute_v1


class GceClient:
    """Lazily made REST clients for one project, called in worker threads (an ``OffLoop``)."""

    def __init__(self, *, project: str, endpoint: str | None, credentials: Any = None, max_workers: int = 8,
                 call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.project = project
        self.endpoint = endpoint
        self.max_workers = max_workers
        self.call_timeout_s = call_timeout_s
        self._credentials = credentials
        self._calls = OffLoop("flowmesh-gce", max_workers, self._make_client,
                              closed_error=lambda: ProviderError("the gce provider is closed", provider=PROVIDER,
                                                                 code="Closed"),
                              close_client=lambda c: c.transport.close())
        install_log_redaction()

    def __repr__(self) -> str:
        return (f"GceClient(project={self.project!r}, endpoint={redact_url(self.endpoint)!r}, "
                f"max_workers={self.max_workers})")

    # ---- in a worker thread ------------------------------------------------------
    def _creds(self) -> Any:
        if self._credentials is None:
            import google.auth
            import google.auth.exceptions
            try:
                self._credentials, _ = google.auth.default(
                    scopes=["https://www.googleapis.com/auth/compute"])
            except google.auth.exceptions.DefaultCredentialsError as exc:
                raise missing_credentials(exc) from exc
        return self._credentials

    def client(self, kind: str) -> Any:
        """``instances``, ``machine_types`` or ``zone_operations`` (made once, same options)."""
        return self._calls.client(kind)

    def _make_client(self, kind: str) -> Any:
        compute_v1 = _import()
        from google.api_core.client_options import ClientOptions
        cls = {"instances": compute_v1.InstancesClient, "machine_types": compute_v1.MachineTypesClient,
               "zone_operations": compute_v1.ZoneOperationsClient}[kind]
        opts = ClientOptions(api_endpoint=self.endpoint) if self.endpoint else None
        return cls(credentials=self._creds(), client_options=opts, transport="rest")

    def _run(self, where: str, fn: Callable[[], T]) -> T:
        from google.api_core import exceptions as gexc
        import google.auth.exceptions as aexc
        import requests
        try:
            return fn()
        except FlowMeshError:
            raise
        except gexc.GoogleAPICallError as exc:
            raise map_api_error(exc, project=self.project, where=where) from exc
        except aexc.DefaultCredentialsError as exc:
            raise missing_credentials(exc) from exc
        except (aexc.TransportError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise unreachable(exc, endpoint=self.endpoint) from exc
        except gexc.GoogleAPIError as exc:
            raise ProviderError(f"{where}: {type(exc).__name__}: {exc}", provider=PROVIDER,
                                code=type(exc).__name__) from exc

    # ---- on the event loop -------------------------------------------------------
    async def call(self, where: str, kind: str, method: str, **request: Any) -> Any:
        """``client(kind).method(request=request, retry=None, timeout=...)`` in the executor.
        Pagers are read to the end in the same worker job (a list comes back)."""
        log.debug("gce %s %s.%s", where, kind, method)

        def job() -> Any:
            def go() -> Any:
                result = getattr(self.client(kind), method)(request=request, retry=None,
                                                            timeout=self.call_timeout_s)
                if hasattr(result, "pages"):
                    return list(result)
                return result
            return self._run(where, go)
        return await self._calls.run(job)

    async def wait(self, zone: str, op: Any, *, deadline_s: float) -> Any:
        """Wait for a zone operation with ``zoneOperations.wait`` until it is DONE (its
        error mapped and raised) or ``deadline_s`` passes (``ProviderUnavailableError``,
        code ``OperationTimeout``: it may still finish; a retry with the same request id
        finds what it made)."""
        compute_v1 = _import()
        done = compute_v1.Operation.Status.DONE
        end = time.monotonic() + deadline_s
        where = f"zone {zone}"
        while op.status != done:
            left = end - time.monotonic()
            if left <= 0:
                raise ProviderUnavailableError(
                    f"{where}: operation {op.name} ({op.operation_type}) not done after {deadline_s:g} s",
                    provider=PROVIDER, code="OperationTimeout")
            op = await self._wait_round(where, zone, op.name, min(WAIT_ROUND_S, left))
        if op.error and op.error.errors:
            # The operation's own error, as the library's exception (HTTP status and entries),
            # so the cloud's error is chained as the cause like any other call's.
            from google.api_core import exceptions as gexc
            cause = gexc.from_http_status(int(op.http_error_status_code or 500),
                                          f"operation {op.name}: {op.http_error_message}",
                                          errors=[{"code": e.code, "message": e.message} for e in op.error.errors])
            raise map_operation_error(op, where=where) from cause
        return op

    async def _wait_round(self, where: str, zone: str, name: str, timeout: float) -> Any:
        def job() -> Any:
            return self._run(where, lambda: self.client("zone_operations").wait(
                project=self.project, zone=zone, operation=name, retry=None, timeout=timeout + 5))
        return await self._calls.run(job)

    async def close(self) -> None:
        await self._calls.close()


__all__ = ["GceClient", "MAX_LAUNCH_BATCH", "RATES", "install_log_redaction"]
