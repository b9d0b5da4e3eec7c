"""ECS clients (``alibabacloud-ecs20140526``), one per region, called through their native
``*_async`` methods.

Facts checked against the installed libraries (alibabacloud-ecs20140526 7.11,
alibabacloud-tea-openapi 0.4, darabonba-core 1.0; 2026-12-01) and what the driver does:

* Every ECS action has a ``<name>_with_options_async(request, RuntimeOptions)`` coroutine
  that sends the request over aiohttp on the running loop; nothing blocks the event loop
  and no thread executor is needed.  (Credentials from a profile file are read by the
  credentials library on the first call; that is a small local file read.)
* ``Config(endpoint="127.0.0.1:PORT", protocol="HTTP", region_id=...)`` points a client
  at the emulator; the default endpoint is ``ecs.<region>.aliyuncs.com`` over HTTPS.
  Requests are ``POST /`` with the parameters in the query string and an empty body,
  signed ``ACS3-HMAC-SHA256`` with the action in the ``x-acs-action`` header.
* Retries are off: the client's ``retry_options`` is ``RetryOptions(retryable=False)``
  (with none set, the library makes one attempt today; it is set explicitly so a library
  default can never add hidden retries) and every call passes ``RuntimeOptions(autoretry=
  False, max_attempts=1)``.  Retries, rate limits and failover wrap the provider contract
  from outside (:mod:`flowmesh_sdk.provisioning`).
* Credentials (never logged or shown in a repr): explicit keys, else Alibaba's standard
  variables ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` /
  ``ALIBABA_CLOUD_SECURITY_TOKEN`` (read when the provider is made), else a profile file
  (``ALIBABA_CLOUD_CREDENTIALS_FILE`` or ``~/.alibabacloud/credentials.ini``, then the
  CLI's ``~/.aliyun/config.json``, profile ``ALIBABA_CLOUD_PROFILE``), else the ECS
  instance's RAM role only when asked for (``ram_role=True``: it is fetched from the
  metadata address 100.100.100.200, which a coordinator off ECS must never probe).
  The library's own default chain is not used: it reads the environment once at import
  and probes the metadata address by default.

Published limits (sources in docs/providers/alibaba.md): ECS throttles each API per
account and region ("API call throttling", https://www.alibabacloud.com/help/doc-detail/437902.htm);
the per-API thresholds are shown only in the Quota Center console, and a throttled
minute T blocks that API until minute T+1; at most 5,000 instances can be created per
account per minute.  ``RunInstances`` takes ``Amount`` 1..100; ``DescribeInstances`` takes
at most 100 ``InstanceIds`` and ``MaxResults`` 100; ``DeleteInstances`` at most 100
``InstanceId.N``.  :data:`RATES` declares conservative client-side buckets inside those:
launch 10 calls at 1/s and 5,000 instances at 83.3/s (the creation limit), terminate 10 at
2/s, describe and list 20 at 5/s each.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flowmesh_sdk import settings as _settings
from flowmesh_sdk.errors import FlowMeshError, ProviderError
from flowmesh_sdk.provider import ApiRate
from flowmesh_sdk.redaction import redact_url

from .errors import PROVIDER, map_error, missing_credentials

log = logging.getLogger("flowmesh.providers.alibaba")

MAX_LAUNCH_BATCH = 100          # RunInstances Amount: 1..100
DESCRIBE_CHUNK = 100            # DescribeInstances InstanceIds (JSON array) and MaxResults
DELETE_CHUNK = 100              # DeleteInstances InstanceId.N
TYPES_CHUNK = 10                # DescribeInstanceTypes InstanceTypes.N
MAX_TAGS = 20                   # tags per resource (and Tag.N on RunInstances)
CREATE_PER_MINUTE = 5000        # instances one account may create per minute
ENV_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"

RATES: tuple[ApiRate, ...] = (
    ApiRate("launch", rate_per_s=1.0, burst=10),
    ApiRate("launch", rate_per_s=CREATE_PER_MINUTE / 60.0, burst=CREATE_PER_MINUTE, per_instance=True),
    ApiRate("terminate", rate_per_s=2.0, burst=10),
    ApiRate("describe", rate_per_s=5.0, burst=20),
    ApiRate("list", rate_per_s=5.0, burst=20),
)
_INSTALL = "the alibaba provider needs the ECS SDK: pip install 'flowmesh-sdk[alibaba]'"


def sdk() -> tuple[Any, Any, Any, Any]:
    """(Client, models, open_api_models, RuntimeOptions), imported on first use."""
    try:
        from alibabacloud_ecs20140526 import models
        from alibabacloud_ecs20140526.client import Client
        from alibabacloud_tea_openapi import models as open_api_models
        from darabonba.runtime import RuntimeOptions
    except ImportError as exc:  # pragma: no cover - the dev extra installs it
        raise ProviderError(_INSTALL, provider=PROVIDER, code="MissingDependency") from exc
    return Client, models, open_api_models, RuntimeOptions


class Credentials:
    """Where the keys come from (never their values in a repr)."""

    def __init__(self, *, access_key_id: str | None = None, access_key_secret: str | None = None,
                 security_token: str | None = None, ram_role: bool | str = False) -> None:
        self._id = access_key_id or _settings.value("providers.alibaba.access_key_id")
        self._secret = access_key_secret or _settings.value("providers.alibaba.access_key_secret")
        self._token = security_token or os.environ.get(ENV_TOKEN) or None
        self.origin = "explicit" if access_key_id else ("env" if self._id else "")
        self._provider: Any = None
        if not (self._id and self._secret):
            self._id = self._secret = None
            self._provider, self.origin = self._profile(ram_role)

    def __repr__(self) -> str:
        return f"Credentials(origin={self.origin or 'none'!r})"

    @staticmethod
    def _profile(ram_role: bool | str) -> tuple[Any, str]:
        home = Path(os.environ.get("HOME") or Path.home())
        ini = os.environ.get("ALIBABA_CLOUD_CREDENTIALS_FILE") or str(home / ".alibabacloud" / "credentials.ini")
        cli = home / ".aliyun" / "config.json"
        name = os.environ.get("ALIBABA_CLOUD_PROFILE") or None
        try:
            from alibabacloud_credentials.client import Client as CredentialClient
            from alibabacloud_credentials.provider import (CLIProfileCredentialsProvider, EcsRamRoleCredentialsProvider,
                                                           ProfileCredentialsProvider)
        except ImportError:  # pragma: no cover - a dependency of the ECS SDK
            return None, ""
        if os.path.isfile(ini):
            return CredentialClient(provider=ProfileCredentialsProvider(profile_file=ini, profile_name=name)), ini
        if cli.is_file():
            return CredentialClient(provider=CLIProfileCredentialsProvider(profile_file=str(cli),
                                                                           profile_name=name)), str(cli)
        if ram_role:
            role = ram_role if isinstance(ram_role, str) else None
            return CredentialClient(provider=EcsRamRoleCredentialsProvider(role_name=role)), "ecs-ram-role"
        return None, ""

    def config_kwargs(self) -> dict[str, Any]:
        if self._id and self._secret:
            out: dict[str, Any] = {"access_key_id": self._id, "access_key_secret": self._secret}
            if self._token:
                out["security_token"] = self._token
            return out
        if self._provider is not None:
            return {"credential": self._provider}
        raise missing_credentials()


class EcsClient:
    """Lazily made per-region ECS clients sharing one set of credentials."""

    def __init__(self, *, credentials: Credentials, endpoint: str | None = None, read_timeout_ms: int = 60_000,
                 connect_timeout_ms: int = 10_000) -> None:
        self.credentials = credentials
        self.endpoint = endpoint
        self.read_timeout_ms = read_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._clients: dict[str, Any] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"EcsClient(endpoint={redact_url(self.endpoint)!r}, {self.credentials!r})"

    def _client(self, region: str) -> Any:
        client = self._clients.get(region)
        if client is None:
            Client, _models, open_api_models, _rt = sdk()
            from darabonba.policy.retry import RetryOptions
            if self.endpoint:
                parts = urllib.parse.urlsplit(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
                host, protocol = parts.netloc, (parts.scheme or "https").upper()
            else:
                host, protocol = f"ecs.{region}.aliyuncs.com", "HTTPS"
            config = open_api_models.Config(endpoint=host, protocol=protocol, region_id=region,
                                            read_timeout=self.read_timeout_ms, connect_timeout=self.connect_timeout_ms,
                                            retry_options=RetryOptions({"retryable": False}),
                                            user_agent="flowmesh-sdk", **self.credentials.config_kwargs())
            client = Client(config)
            self._clients[region] = client
        return client

    async def call(self, region: str, action: str, request: Any) -> Any:
        """``<action>_with_options_async(request, RuntimeOptions(autoretry=False))`` on the
        region's client; errors mapped (cause chained).  ``action`` is the snake-case
        method name (``run_instances``); the answer's ``body`` is returned."""
        if self._closed:
            raise ProviderError("the alibaba provider is closed", provider=PROVIDER, code="Closed")
        _c, _m, _o, RuntimeOptions = sdk()
        where = f"{_camel(action)} in {region}"
        log.debug("alibaba %s", where)
        client = self._client(region)
        runtime = RuntimeOptions(autoretry=False, max_attempts=1, read_timeout=self.read_timeout_ms,
                                 connect_timeout=self.connect_timeout_ms)
        try:
            resp = await getattr(client, f"{action}_with_options_async")(request, runtime)
        except FlowMeshError:
            raise
        except Exception as exc:  # the Tea SDK raises its own exception classes
            raise map_error(exc, where=where) from exc
        return resp.body

    async def close(self) -> None:
        self._closed = True
        self._clients.clear()


def _camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def tags_param(models: Any, cls_name: str, tags: Mapping[str, str], *, keys_only: bool = False) -> list[Any]:
    cls = getattr(models, cls_name)
    return [cls(key=k) if keys_only else cls(key=k, value=v) for k, v in tags.items()]


__all__ = ["Credentials", "DELETE_CHUNK", "DESCRIBE_CHUNK", "EcsClient", "MAX_LAUNCH_BATCH", "MAX_TAGS", "RATES",
           "TYPES_CHUNK", "sdk"]
