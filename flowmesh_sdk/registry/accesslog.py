"""The local registry's access log: distribution's Apache "combined" lines parsed into
:class:`AccessLogEntry`, and :class:`AccessLogReader`, the part of
:class:`~flowmesh_sdk.registry.local.LocalRegistry` that reads it (``request_log``,
``wait_for_log``, ``blob_gets``)."""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from .localbase import RegistryState


# gorilla/handlers' Apache "combined" format, which distribution writes to stdout:
# 127.0.0.1 - - [30/Nov/2026:03:02:16 +0000] "GET /v2/ HTTP/1.1" 401 87 "" "curl/7.88.1"
_COMBINED = re.compile(
    r'^(?P<remote>\S+) \S+ (?P<user>\S+) \[(?P<time>[^\]]+)\] '
    r'"(?P<method>\S+) (?P<path>\S+) (?P<proto>[^"]*)" (?P<status>\d{3}) (?P<size>\d+|-)'
    r'(?: "(?P<referer>[^"]*)" "(?P<agent>[^"]*)")?')

_V2_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs|tags)/(?P<ref>[^?]*)")


@dataclass(frozen=True)
class AccessLogEntry:
    """One line of the registry's access log."""

    method: str
    path: str          # with the query string, as sent
    status: int
    size: int
    user_agent: str
    remote: str
    raw: str

    @property
    def kind(self) -> str:
        """``base``, ``catalog``, ``manifest``, ``blob``, ``upload``, ``tags`` or ``other``."""
        path = self.path.split("?", 1)[0]
        if path in ("/v2", "/v2/"):
            return "base"
        if path == "/v2/_catalog":
            return "catalog"
        if "/blobs/uploads" in path:
            return "upload"
        m = _V2_PATH.match(path)
        if m:
            return {"manifests": "manifest", "blobs": "blob", "tags": "tags"}[m.group("kind")]
        return "other"

    @property
    def repository(self) -> str | None:
        m = _V2_PATH.match(self.path.split("?", 1)[0])
        return m.group("name") if m else None

    @property
    def reference(self) -> str | None:
        """The tag or digest of a manifest request, the digest of a blob request."""
        m = _V2_PATH.match(self.path.split("?", 1)[0])
        return m.group("ref") if m and m.group("kind") != "tags" else None


def parse_access_log(text: str) -> list[AccessLogEntry]:
    entries = []
    for line in text.splitlines():
        m = _COMBINED.match(line)
        if not m:
            continue
        size = m.group("size")
        entries.append(AccessLogEntry(
            method=m.group("method"), path=m.group("path"), status=int(m.group("status")),
            size=0 if size == "-" else int(size), user_agent=m.group("agent") or "",
            remote=m.group("remote"), raw=line))
    return entries


class AccessLogReader:
    """A LocalRegistry's access log (``state.access_log_path``), read back."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state

    def request_log(self) -> list[AccessLogEntry]:
        """The registry's access log so far, parsed (oldest first)."""
        try:
            return parse_access_log(self.state.access_log_path.read_text(errors="replace"))
        except FileNotFoundError:
            return []

    def wait_for_log(self, predicate: Callable[[list[AccessLogEntry]], bool],
                     timeout: float = 5.0) -> list[AccessLogEntry]:
        """The access log once ``predicate(entries)`` holds (the registry writes a line
        just after the response, so a client can finish a moment before its line is there)."""
        deadline = time.monotonic() + timeout
        while True:
            entries = self.request_log()
            if predicate(entries) or time.monotonic() > deadline:
                return entries
            time.sleep(0.02)

    def blob_gets(self, entries: Iterable[AccessLogEntry] | None = None) -> Counter[str]:
        """GETs of blobs by digest (any status) in the access log."""
        entries = self.request_log() if entries is None else entries
        return Counter(e.reference for e in entries
                       if e.method == "GET" and e.kind == "blob" and e.reference)
