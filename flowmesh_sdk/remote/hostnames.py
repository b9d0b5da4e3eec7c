"""Which host names and login names an SSH target may have: what OpenSSH's ``ssh`` accepts
on its command line.

OpenSSH 9.6 (the CVE-2023-51385 fix) refuses a host or user given on the command line that
could be read as an option or change the meaning of a shell command it is expanded into
(``%h``, ``%n``, ``%r`` in a ``ProxyCommand``, which runs through a shell).  Its
``valid_hostname`` refuses a name that begins with ``-`` or holds whitespace, a control
character or one of ``'`"$\\;&<>|(){},``; its ``valid_ruser`` refuses a user that begins
with ``-``, holds a control character or one of ``'`";&<>|(){}``, has whitespace before a
``-`` or ends with a backslash.  Everything else is allowed: IPv6 literals (``::1``,
``fe80::1%eth0``), ssh config aliases with ``*``, ``_``, non-ASCII letters.  Names that come
from the ssh config itself (``HostName``, ``User``) are the user's own and are not checked,
as in OpenSSH.

A host may be written ``user@host`` (the user checked as a user) and, as fabric reads it,
``host:port`` when it holds exactly one colon (the port must then be a port number).
"""

from __future__ import annotations

import unicodedata

from ..errors import SpecError

_HOST_REFUSED = "'`\"$\\;&<>|(){},"
_USER_REFUSED = "'`\";&<>|(){}"
HOST_ALLOWED = ("a host name, address or ssh config alias: not beginning with '-', without whitespace, "
                "control characters or any of ' ` \" $ \\ ; & < > | ( ) { } , (as OpenSSH's ssh)")
USER_ALLOWED = ("a login name: not beginning with '-', without control characters or any of "
                "' ` \" ; & < > | ( ) { }, no whitespace before a '-', not ending with '\\' (as OpenSSH's ssh)")


def _control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc"


def _host_problem(host: str) -> str:
    if not host:
        return "is empty"
    if host.startswith("-"):
        return "begins with '-' (it would read as an option)"
    for ch in host:
        if ch.isspace() or _control(ch):
            return f"holds the whitespace or control character {ch!r}"
        if ch in _HOST_REFUSED:
            return f"holds the shell metacharacter {ch!r}"
    return ""


def _user_problem(user: str) -> str:
    if not user:
        return "is empty"
    if user.startswith("-"):
        return "begins with '-' (it would read as an option)"
    for i, ch in enumerate(user):
        if _control(ch):
            return f"holds the control character {ch!r}"
        if ch in _USER_REFUSED:
            return f"holds the shell metacharacter {ch!r}"
        if ch.isspace() and user[i + 1:i + 2] == "-":
            return "has whitespace before a '-'"
    if user.endswith("\\"):
        return "ends with a backslash"
    return ""


def check_user(field_name: str, user: object) -> None:
    """Raise :class:`SpecError` on ``field_name`` unless ``user`` is a login name OpenSSH's
    ``ssh`` accepts on its command line."""
    if not isinstance(user, str):
        raise SpecError(field_name, f"must be {USER_ALLOWED}; got {type(user).__name__}")
    problem = _user_problem(user)
    if problem:
        raise SpecError(field_name, f"{user!r} {problem}; it must be {USER_ALLOWED}")


def check_host(field_name: str, host: object) -> None:
    """Raise :class:`SpecError` on ``field_name`` unless ``host`` is a host OpenSSH's ``ssh``
    accepts on its command line (``user@`` and a ``:port`` suffix as fabric reads them)."""
    if not isinstance(host, str):
        raise SpecError(field_name, f"must be {HOST_ALLOWED}; got {type(host).__name__}")
    user, at, name = host.rpartition("@")
    if at:
        problem = _user_problem(user)
        if problem:
            raise SpecError(field_name, f"the user {user!r} of {host!r} {problem}; it must be {USER_ALLOWED}")
    problem = _host_problem(name)
    if problem:
        raise SpecError(field_name, f"{host!r} {problem}; it must be {HOST_ALLOWED}")
    if name.count(":") == 1:   # fabric reads host:port (more colons: an IPv6 literal)
        before, _, port = name.partition(":")
        if not before:
            raise SpecError(field_name, f"{host!r}: no host before the ':'; it must be {HOST_ALLOWED}")
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise SpecError(field_name, f"{host!r}: after a single ':' there must be a port, 1-65535 "
                                        "(an IPv6 address has more colons; or give the port apart)")
