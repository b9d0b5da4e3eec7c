"""Secrets out of what the SDK shows: URLs' passwords, and client libraries' DEBUG records.

:func:`redact_url` is the one way a URL is shown (errors, logs, reprs, ``flowmesh
status``, ``flowmesh config show``): the password of every URL in a text as ``***``.

A cloud library may log request and response payloads at DEBUG level, and some carry a
secret (user data with an instance's private host key).  :func:`install` puts a filter on
the library's loggers (once per logger and ``tag``) that rewrites a record before any
handler sees it: its message when ``trigger`` occurs in it, and the ``payload`` of the
structured extras named in ``extras``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import overload

REDACTED = "***"

# scheme://userinfo@ -- the userinfo runs to the last '@' before the authority ends (as
# urllib.parse.urlsplit reads it), so a password holding an unescaped '@' is redacted whole
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
# a credential in the query (redis-py reads ``?password=``)
_QUERY = re.compile(r"(?P<name>[?&](?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key)=)[^&#\s]*",
                    re.IGNORECASE)


def _hide(m: re.Match[str]) -> str:
    user, colon, _password = m["userinfo"].partition(":")
    return f"{m['scheme']}{user}{colon}{REDACTED if colon else ''}@"


@overload
def redact_url(text: str) -> str: ...
@overload
def redact_url(text: None) -> None: ...


def redact_url(text: str | None) -> str | None:
    """``text`` with the password of every URL in it as ``***`` (``redis://:pw@h:6379/0`` ->
    ``redis://:***@h:6379/0``; the user name, host, port and path are kept; a text without
    a URL comes back as it was); so is a credential in its query (``?password=...``).
    None (an endpoint not set) stays None."""
    if text is None:
        return None
    return _QUERY.sub(lambda m: m["name"] + REDACTED, _USERINFO.sub(_hide, text))


class RedactingFilter(logging.Filter):
    def __init__(self, tag: str, redact: Callable[[str], str], trigger: str,
                 extras: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.tag = tag
        self._redact = redact
        self._trigger = trigger
        self._extras = extras

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is not ours to fix
            return True
        if self._trigger in msg:
            record.msg, record.args = self._redact(msg), ()
        for name in self._extras:
            extra = getattr(record, name, None)
            if isinstance(extra, dict) and isinstance(extra.get("payload"), str):
                setattr(record, name, {**extra, "payload": self._redact(extra["payload"])})
        return True


def install(loggers: Iterable[str], tag: str, redact: Callable[[str], str], trigger: str,
            extras: tuple[str, ...] = ()) -> None:
    """A :class:`RedactingFilter` on each of ``loggers`` that has none with ``tag`` yet."""
    for name in loggers:
        lg = logging.getLogger(name)
        if not any(getattr(f, "tag", None) == tag for f in lg.filters):
            lg.addFilter(RedactingFilter(tag, redact, trigger, extras))


__all__ = ["REDACTED", "RedactingFilter", "install", "redact_url"]
