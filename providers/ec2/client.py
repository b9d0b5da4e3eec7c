"""boto3 EC2 clients, one per region, driven off the event loop.

Every boto3 call runs in the bounded thread pool of a :class:`~flowmesh_sdk.offloop.OffLoop`
(``max_workers``); nothing blocks the event loop, not even creating a client.  botocore's
own retries are off (``retries={"mode": "standard", "total_max_attempts": 1}``: one
attempt, no retry -- note that botocore's ``max_attempts`` in a ``Config`` counts
*retries*, so ``max_attempts=1`` would still retry once).  Retries, rate limits and
failover wrap the provider contract from outside (:mod:`flowmesh_sdk.provisioning`); a
hidden retry inside the driver would double-count against the account's buckets and
delay failover.

boto3 and botocore are imported lazily, on the first call, so importing this package
(or :mod:`flowmesh_sdk`) never imports them; without the ``ec2`` extra installed the
first call says how to install it.

Request throttling for the Amazon EC2 API
-----------------------------------------

EC2 throttles per account and per region with token buckets: a *request* bucket per
API (one token per call) and, for a few APIs, a *resource* bucket (one token per
instance).  Source: "Request throttling for the Amazon EC2 API", Amazon EC2 Developer
Guide, https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html
(tables "Request token bucket sizes and refill rates" and "Resource token bucket sizes
and refill rates"; read 2026-11-30).

=================================================  ==========  ===========  ==========================
API (bucket)                                       capacity    refill /s    used by
=================================================  ==========  ===========  ==========================
RunInstances, request (uncategorized action)       5           2            launch
RunInstances, resource (instances launched)        1000        2            launch (per instance)
TerminateInstances, request (uncategorized)        100         5            terminate
TerminateInstances, resource (instances)           1000        20           terminate (per instance)
DescribeInstances, filtered or paginated           100         20           describe, list_tagged,
  ("Non-mutating actions")                                                  launch's idempotency check
DescribeInstances, unfiltered AND unpaginated      50          10           never (always filtered)
DescribeInstanceTypes / DescribeImages             100         20           offers, launch checks
  ("Non-mutating actions")                                                  (cached per region)
StartInstances request / resource                  5 / 1000    2 / 2        (not used)
StopInstances resource                             1000        20           (not used)
=================================================  ==========  ===========  ==========================

:data:`RATES` declares these to the core as :class:`~flowmesh_sdk.provider.ApiRate`
buckets.  ``describe`` and ``list`` both spend DescribeInstances tokens (and launch
spends one for its idempotency check), so the one real bucket (100, 20/s) is split:
describe 40 at 8/s, list 40 at 8/s, leaving 20 at 4/s for launch's checks (at most 2/s,
bounded by the RunInstances bucket).

``max_batch`` is 1000: RunInstances ``MaxCount`` has no fixed API maximum (the API
reference says "between 1 and the quota for the specified instance type for your
account for this Region"), but the resource bucket holds 1000 instances, so a larger
single call could never be served at once.  TerminateInstances takes "up to 1000
instance IDs" per call.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from flowmesh_sdk import redaction
from flowmesh_sdk.errors import ProviderError
from flowmesh_sdk.offloop import OffLoop
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.redaction import redact_url

from .errors import PROVIDER, endpoint_unreachable, map_client_error, missing_credentials

log = logging.getLogger("flowmesh.providers.ec2")
T = TypeVar("T")

DOC_THROTTLING = "https://docs.aws.amazon.com/ec2/latest/devguide/ec2-api-throttling.html"

RUN_INSTANCES_REQUEST = (5, 2.0)          # (bucket capacity, refill per second)
RUN_INSTANCES_RESOURCE = (1000, 2.0)
TERMINATE_INSTANCES_REQUEST = (100, 5.0)
TERMINATE_INSTANCES_RESOURCE = (1000, 20.0)
DESCRIBE_NON_MUTATING = (100, 20.0)       # filtered/paginated DescribeInstances and other Describe*
DESCRIBE_UNFILTERED = (50, 10.0)          # DescribeInstances without filter and pagination (avoided)

MAX_LAUNCH_BATCH = 1000                   # = RunInstances resource bucket capacity
TERMINATE_CHUNK = 1000                    # TerminateInstances: up to 1000 ids per call
DESCRIBE_PAGE = 1000                      # DescribeInstances MaxResults: 5..1000
ID_FILTER_CHUNK = 200                     # ids per instance-id filter (conservative; see provider.py)

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=RUN_INSTANCES_REQUEST[1], burst=RUN_INSTANCES_REQUEST[0]),
    ApiRate("launch", rate_per_s=RUN_INSTANCES_RESOURCE[1], burst=RUN_INSTANCES_RESOURCE[0],
            per_instance=True),
    ApiRate("terminate", rate_per_s=TERMINATE_INSTANCES_REQUEST[1], burst=TERMINATE_INSTANCES_REQUEST[0]),
    ApiRate("terminate", rate_per_s=TERMINATE_INSTANCES_RESOURCE[1], burst=TERMINATE_INSTANCES_RESOURCE[0],
            per_instance=True),
    ApiRate("describe", rate_per_s=8.0, burst=40),
    ApiRate("list", rate_per_s=8.0, burst=40),
)

_INSTALL_HINT = "the ec2 provider needs boto3: pip install 'flowmesh-sdk[ec2]'"

# User data can carry secrets (in SSH mode: the instance's private host key, see
# flowmesh_sdk/remote/cloudinit.py).  At DEBUG level botocore logs every request's params
# ("botocore.endpoint": 'UserData': '<base64>') and every response body
# ("botocore.parsers": <userData><value>base64</value>); checked with botocore 1.44.
# A filter on those two loggers blanks the value before any handler sees the record.
_USER_DATA_VALUE = re.compile(
    r"""((?:UserData|userData)['"]?\s*[:=]\s*(?:\{\s*['"]Value['"]\s*:\s*)?['"]?|<userData>\s*<value>)"""
    r"""[A-Za-z0-9+/=%\\]+""")
_REDACTED_LOGGERS = ("botocore.endpoint", "botocore.parsers")


def install_log_redaction() -> None:
    """Put the user-data redaction filter on botocore's request/response loggers (once)."""
    redaction.install(_REDACTED_LOGGERS, "ec2-user-data", lambda m: _USER_DATA_VALUE.sub(r"\1<redacted>", m),
                      trigger="serData")


def _import_boto() -> tuple[Any, Any, Any]:
    try:
        import boto3.session
        import botocore.config
        import botocore.exceptions
    except ImportError as exc:  # pragma: no cover - the dev extra installs boto3
        raise ProviderError(_INSTALL_HINT, provider=PROVIDER, code="MissingDependency") from exc
    return boto3.session, botocore.config, botocore.exceptions


class Ec2Client:
    """Lazily created per-region boto3 clients and an executor to call them from.

    ``session_kwargs`` go to ``boto3.session.Session`` (e.g. ``profile_name``, or
    explicit keys for a test fixture); they are never logged or shown in a repr."""

    def __init__(self, *, endpoint_url: str | None, max_workers: int,
                 session_kwargs: Mapping[str, Any] | None = None) -> None:
        self.endpoint_url = endpoint_url
        self.max_workers = max_workers
        self._session_kwargs = dict(session_kwargs or {})
        self._session: Any = None
        self._calls = OffLoop("flowmesh-ec2", max_workers, self._make_client, closed_error=lambda: ProviderError(
            "the ec2 provider is closed", provider=PROVIDER, code="Closed"))
        install_log_redaction()

    def __repr__(self) -> str:
        return f"Ec2Client(endpoint_url={redact_url(self.endpoint_url)!r}, max_workers={self.max_workers})"

    # ---- in a worker thread ------------------------------------------------------
    def _make_client(self, region: str) -> Any:
        session_mod, config_mod, _ = _import_boto()
        if self._session is None:
            self._session = session_mod.Session(**self._session_kwargs)
        config = config_mod.Config(retries={"mode": "standard", "total_max_attempts": 1},
                                   user_agent_extra="flowmesh-sdk")
        return self._session.client("ec2", region_name=region, endpoint_url=self.endpoint_url, config=config)

    def _run(self, region: str, operation: str, fn: Callable[[Any], T]) -> T:
        """``fn(client)`` with botocore's exceptions turned into the SDK's (cause chained)."""
        _, _, exc_mod = _import_boto()
        try:
            return fn(self._calls.client(region))
        except exc_mod.ClientError as exc:
            raise map_client_error(exc, region=region) from exc
        except (exc_mod.NoCredentialsError, exc_mod.PartialCredentialsError) as exc:
            raise missing_credentials(exc, region=region) from exc
        except (exc_mod.EndpointConnectionError, exc_mod.ConnectTimeoutError, exc_mod.ReadTimeoutError,
                exc_mod.ConnectionClosedError) as exc:
            raise endpoint_unreachable(exc, region=region, endpoint=self.endpoint_url) from exc
        except exc_mod.BotoCoreError as exc:
            raise ProviderError(f"{operation} in {region}: {type(exc).__name__}: {exc}",
                                provider=PROVIDER, code=type(exc).__name__) from exc

    # ---- on the event loop -------------------------------------------------------
    async def call(self, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One EC2 API call (``operation`` is the boto3 method name, e.g. ``run_instances``)."""
        log.debug("ec2 %s %s", region, operation)
        return await self._calls.run(lambda: self._run(region, operation,
                                                       lambda c: getattr(c, operation)(**params)))

    async def pages(self, region: str, operation: str, **params: Any) -> list[dict[str, Any]]:
        """Every page of a paginated operation, fetched in one worker job."""
        log.debug("ec2 %s %s (paginated)", region, operation)

        def all_pages(client: Any) -> list[dict[str, Any]]:
            return list(client.get_paginator(operation).paginate(**params))
        return await self._calls.run(lambda: self._run(region, operation, all_pages))

    async def close(self) -> None:
        await self._calls.close()


__all__ = ["DOC_THROTTLING", "Ec2Client", "MAX_LAUNCH_BATCH", "RATES", "install_log_redaction"]
