"""The ``k8s`` provider's clusters: the kubeconfig loaded once (:func:`.config.load`), one
``ApiClient`` per context, every blocking call on the bounded worker threads of an
:class:`~flowmesh_sdk.offloop.OffLoop` with its errors mapped onto the SDK's (:mod:`.errors`),
and raw responses read as JSON (``_preload_content=False``: no model objects).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from flowmesh_sdk.errors import FlowMeshError, ProviderError
from flowmesh_sdk.offloop import OffLoop

from . import config
from .errors import PROVIDER, map_api_error, unreachable

T = TypeVar("T")


def core(api_client: Any) -> Any:
    """The CoreV1Api of ``api_client``."""
    from kubernetes import client   # the k8s extra
    return client.CoreV1Api(api_client)


def json_of(resp: Any) -> dict[str, Any]:
    """A raw (``_preload_content=False``) response's JSON object ({} when it is none)."""
    data = json.loads(resp.data or b"{}")
    return data if isinstance(data, dict) else {}


class Clusters:
    """Where the provider's calls go: ``kubeconfig``'s ``contexts`` x ``namespaces``
    (:mod:`.config`), loaded on the first call that needs them."""

    def __init__(self, kubeconfig: str | None, contexts: Sequence[str] | None, namespaces: Sequence[str] | None,
                 max_workers: int) -> None:
        self._kubeconfig, self._contexts, self._namespaces = kubeconfig, contexts, namespaces
        self._off = OffLoop("flowmesh-k8s", max_workers, self._make_client,
                            closed_error=lambda: ProviderError("provider closed", provider=PROVIDER, code="Closed"))
        self._setup: asyncio.Task[tuple[list[config.Target], dict[str, Any]]] | None = None

    def _make_client(self, context: str) -> Any:
        from kubernetes import client   # the k8s extra
        return client.ApiClient(self.configuration(context))

    def configuration(self, context: str) -> Any:
        """``context``'s client Configuration (the kubeconfig is loaded: a call came first)."""
        assert self._setup is not None and self._setup.done()
        return self._setup.result()[1][context]

    async def targets(self) -> tuple[list[config.Target], dict[str, Any]]:
        """The (context, namespace) targets and each context's Configuration (loaded once)."""
        if self._setup is None:
            self._setup = asyncio.ensure_future(self._off.run(
                lambda: config.load(self._kubeconfig, self._contexts, self._namespaces)))
        return await asyncio.shield(self._setup)

    async def api_client(self, context: str) -> Any:
        """``context``'s ApiClient (made on a worker thread, once)."""
        return await self._off.run(lambda: self._off.client(context))

    async def call(self, context: str, where: str, fn: Callable[[Any], T]) -> T:
        """``fn(ApiClient)`` off the loop, its errors the SDK's."""
        from kubernetes.client.exceptions import ApiException   # the k8s extra

        def run() -> T:
            return fn(self._off.client(context))

        try:
            return await self._off.run(run)
        except ApiException as exc:
            raise map_api_error(exc, where=where, context=context) from exc
        except FlowMeshError:
            raise
        except OSError as exc:
            raise unreachable(exc, where=where, context=context, server=self._server(context)) from exc
        except Exception as exc:  # urllib3's MaxRetryError/ProtocolError: no answer
            if type(exc).__module__.startswith("urllib3"):
                raise unreachable(exc, where=where, context=context, server=self._server(context)) from exc
            raise

    def _server(self, context: str) -> str:
        if self._setup is None or not self._setup.done():
            return "?"
        return str(self._setup.result()[1][context].host)

    async def send(self, fn: Callable[[], T]) -> T:
        """A blocking callable on the worker threads."""
        return await self._off.run(fn)

    async def close(self) -> None:
        await self._off.close()


__all__ = ["Clusters", "core", "json_of"]
