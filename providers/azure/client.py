"""Azure management clients (compute, network, resource), driven off the event loop.

Facts checked against the installed libraries (azure-mgmt-compute 39.0, azure-mgmt-network
33.1, azure-mgmt-resource 26.0, azure-core 1.41, azure-identity 1.27; 2026-12-01):

* ``ComputeManagementClient(credential, subscription_id, base_url=URL)`` (and the network and
  resource clients) talk to ``URL``; ``ResourceManagementClient`` lives in
  ``azure.mgmt.resource.resources`` in current releases.
* The client's own retries are off: ``retry_total=0`` (azure-core retries 3 more times by
  default).  Retries, rate limits and failover wrap the provider contract from outside.
* The bearer-token policy refuses plain HTTP.  For the emulator only (``allow_http=True``,
  an ``http://127.0.0.1`` endpoint), a per-call policy sets ``enforce_https=False`` in each
  request's context; the credential flow itself is untouched, and nothing relaxes it for a
  real (https) endpoint.
* Long-running operations (``begin_*``) follow ``Azure-AsyncOperation`` until
  ``Succeeded``, then GET the resource.  They are polled by :class:`DeadlinePolling`, an
  ``ARMPolling`` whose waits stop at a deadline (``ProviderUnavailableError``, code
  ``OperationTimeout``) -- azure-core itself polls without one; ``polling_interval`` is
  its delay (a ``Retry-After`` header overrides it; the emulator sends none).
* There is no async management client in use here: every call (and every poller's
  ``result()``) runs in the bounded thread pool of a :class:`~flowmesh_sdk.offloop.OffLoop`.

Credentials: ``DefaultAzureCredential`` (made in a worker thread on the first call) unless
a credential was given; never logged or shown in a repr.

Published rate limits ("Understand how Azure Resource Manager throttles requests",
https://learn.microsoft.com/azure/azure-resource-manager/management/request-limits-and-throttling):
ARM throttles per subscription and region with token buckets -- writes: bucket 200,
refilled 10 per second; deletes: 200 and 10/s; reads: 250 and 25/s -- and Microsoft.Compute
adds its own per-API policies (answers 429 with ``Retry-After``).  :data:`RATES` stays
inside them: launch 1 token per VM (one PUT each), 200 at 10/s; terminate 200 at 10/s;
describe and list 100 at 10/s each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from flowmesh_sdk.errors import FlowMeshError, ProviderError, ProviderUnavailableError
from flowmesh_sdk.offloop import OffLoop
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.redaction import redact_url

from .errors import PROVIDER, map_http_error, missing_credentials, unreachable

log = logging.getLogger("flowmesh.providers.azure")
T = TypeVar("T")

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=10.0, burst=200, per_instance=True),
    ApiRate("terminate", rate_per_s=10.0, burst=200),
    ApiRate("describe", rate_per_s=10.0, burst=100),
    ApiRate("list", rate_per_s=10.0, burst=100),
)
_INSTALL_HINT = ("the azure provider needs azure-mgmt-compute, azure-mgmt-network, azure-mgmt-resource and "
                 "azure-identity: pip install 'flowmesh-sdk[azure]'")


def _policy_class() -> Any:
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    class AllowHttpForEmulator(SansIOHTTPPolicy):
        """Per-call policy: lets the bearer-token policy send a token over plain HTTP to a
        loopback emulator (``enforce_https=False`` in the request context)."""

        def on_request(self, request: Any) -> None:
            request.context["enforce_https"] = False
    return AllowHttpForEmulator


def deadline_polling(interval: float, deadline_s: float, what: str) -> Any:
    """An ``ARMPolling`` that gives up at ``deadline_s`` (see the module docstring)."""
    from azure.mgmt.core.polling.arm_polling import ARMPolling

    class DeadlinePolling(ARMPolling):
        def __init__(self) -> None:
            super().__init__(timeout=interval)
            self._deadline = time.monotonic() + deadline_s

        def _delay(self) -> None:
            if time.monotonic() >= self._deadline:
                raise ProviderUnavailableError(f"{what}: not done after {deadline_s:g} s", provider=PROVIDER,
                                               code="OperationTimeout")
            super()._delay()
    return DeadlinePolling()


class AzureClient:
    """Lazily made management clients for one subscription, called in worker threads (an ``OffLoop``)."""

    def __init__(self, *, subscription_id: str, base_url: str | None, credential: Any = None,
                 max_workers: int = 8, allow_http: bool = False, polling_interval_s: float = 5.0) -> None:
        self.subscription_id = subscription_id
        self.base_url = base_url
        self.max_workers = max_workers
        self.allow_http = allow_http
        self.polling_interval_s = polling_interval_s
        self._credential = credential
        self._calls = OffLoop("flowmesh-azure", max_workers, self._make_client,
                              closed_error=lambda: ProviderError("the azure provider is closed", provider=PROVIDER,
                                                                 code="Closed"))

    def __repr__(self) -> str:
        return f"AzureClient(subscription_id={self.subscription_id!r}, base_url={redact_url(self.base_url)!r})"

    # ---- in a worker thread ------------------------------------------------------
    def _cred(self) -> Any:
        if self._credential is None:
            try:
                from azure.identity import DefaultAzureCredential
            except ImportError as exc:  # pragma: no cover
                raise ProviderError(_INSTALL_HINT, provider=PROVIDER, code="MissingDependency") from exc
            self._credential = DefaultAzureCredential()
        return self._credential

    def client(self, kind: str) -> Any:
        """``compute``, ``network`` or ``resource`` (made once, same options)."""
        return self._calls.client(kind)

    def _make_client(self, kind: str) -> Any:
        cls: Callable[..., Any]    # the management client class of ``kind`` (three unrelated classes)
        try:
            if kind == "compute":
                from azure.mgmt.compute import ComputeManagementClient
                cls = ComputeManagementClient
            elif kind == "network":
                from azure.mgmt.network import NetworkManagementClient
                cls = NetworkManagementClient
            else:
                from azure.mgmt.resource.resources import ResourceManagementClient
                cls = ResourceManagementClient
        except ImportError as exc:
            raise ProviderError(_INSTALL_HINT, provider=PROVIDER, code="MissingDependency") from exc
        kwargs: dict[str, Any] = {"retry_total": 0, "polling_interval": self.polling_interval_s}
        if self.base_url:
            kwargs["base_url"] = self.base_url
        if self.allow_http:
            kwargs["per_call_policies"] = [_policy_class()()]
        return cls(self._cred(), self.subscription_id, **kwargs)

    def _run(self, where: str, fn: Callable[[], T]) -> T:
        from azure.core import exceptions as aexc
        try:
            return fn()
        except FlowMeshError:
            raise
        except aexc.HttpResponseError as exc:
            raise map_http_error(exc, subscription=self.subscription_id, where=where) from exc
        except aexc.ClientAuthenticationError as exc:   # pragma: no cover - a subclass of the above
            raise map_http_error(exc, subscription=self.subscription_id, where=where) from exc
        except (aexc.ServiceRequestError, aexc.ServiceResponseError) as exc:
            raise unreachable(exc, endpoint=self.base_url) from exc
        except aexc.AzureError as exc:
            if type(exc).__name__ == "CredentialUnavailableError":
                raise missing_credentials(exc) from exc
            raise ProviderError(f"{where}: {type(exc).__name__}: {exc}", provider=PROVIDER,
                                code=type(exc).__name__) from exc

    # ---- on the event loop -------------------------------------------------------
    async def call(self, where: str, kind: str, fn: Callable[[Any], T]) -> T:
        """``fn(client(kind))`` in the executor, errors mapped.  A pager is read to the end
        by ``fn`` (``list(...)``) in the same job; a poller's ``result()`` likewise."""
        log.debug("azure %s %s", where, kind)
        return await self._calls.run(lambda: self._run(where, lambda: fn(self.client(kind))))

    async def close(self) -> None:
        await self._calls.close()


__all__ = ["AzureClient", "RATES", "deadline_polling"]
