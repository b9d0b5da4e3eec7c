"""The shared base of the price-API emulators (:mod:`flowmesh_sdk.testing.price_apis`): an
:class:`~flowmesh_sdk.testing.httpserver.HttpServer` that records every request (credentials kept
out of the record) and injects faults; a subclass answers in :meth:`_Emulator.answer`."""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..httpserver import HttpServer, json_response

__all__ = ["Answer", "Recorded"]

#: what :meth:`_Emulator.answer` returns: status, JSON payload, extra headers
Answer = tuple[int, Any, dict[str, str]]
_SECRET_HEADERS = {"authorization", "x-api-key"}


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the emulator saw it (``Authorization`` replaced by its scheme)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]
    body: bytes


@dataclass(slots=True)
class _Fault:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1


class _Emulator(HttpServer):
    """Base: an :class:`~flowmesh_sdk.testing.httpserver.HttpServer` with request
    recording and fault injection; a subclass answers in :meth:`answer`."""

    name = "emulator"

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Recorded] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        split = urllib.parse.urlsplit(request.raw_path)
        query = urllib.parse.parse_qs(split.query, keep_blank_values=True)
        headers = {k.lower(): v for k, v in request.headers.items()}
        shown = {k: (v.split(" ", 1)[0] + " ..." if k in _SECRET_HEADERS else v) for k, v in headers.items()}
        with self._lock:
            self.requests.append(Recorded(request.method, split.path, query, shown, body))
            fault = self._faults[0] if self._faults else None
            if fault is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.pop(0)
        if fault is not None:
            status, payload, extra = fault.status, fault.body, dict(fault.headers)
        else:
            status, payload, extra = self.answer(request.method, split.path, query, headers, body,
                                                 raw_query=split.query)
            extra = dict(extra)
        content_type = extra.pop("Content-Type", "application/json")
        return json_response(status, payload, extra, content_type=content_type)

    def fail_next(self, status: int, body: dict[str, Any] | None = None, *, times: int = 1,
                  headers: Mapping[str, str] | None = None) -> None:
        """Answer the next ``times`` requests with ``status`` and ``body`` (fault injection)."""
        with self._lock:
            self._faults.append(_Fault(status, dict(body or {}), dict(headers or {}), times))

    def answer(self, method: str, path: str, query: Mapping[str, list[str]], headers: Mapping[str, str],
               body: bytes, *, raw_query: str) -> Answer:
        raise NotImplementedError


def _one(query: Mapping[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None
