"""Secrets out of a client library's DEBUG records.

A cloud library may log request and response payloads at DEBUG level, and some carry a
secret (user data with an instance's private host key).  :func:`install` puts a filter on
the library's loggers (once per logger and ``tag``) that rewrites a record before any
handler sees it: its message when ``trigger`` occurs in it, and the ``payload`` of the
structured extras named in ``extras``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable


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


__all__ = ["RedactingFilter", "install"]
