"""The CLI tests' network guard, loaded into a client's own Python (``PYTHONPATH`` names
this folder; Python imports ``sitecustomize`` at start-up): every name lookup and every
connection to an address outside 127.0.0.0/8 (or ::1) is refused and written, one line
each, to the file ``FLOWMESH_NETGUARD_LOG`` names.  The test then asserts the file is
empty: the client never tried to leave loopback, not merely failed to."""

from __future__ import annotations

import ipaddress
import os
import socket

_LOG = os.environ.get("FLOWMESH_NETGUARD_LOG")
_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _local(host: object) -> bool:
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _refuse(what: str) -> None:
    if _LOG:
        with open(_LOG, "a", encoding="utf-8") as f:
            f.write(what + "\n")
    raise OSError(f"flowmesh netguard: {what} refused (tests stay on 127.0.0.0/8)")


if _LOG:
    _getaddrinfo = socket.getaddrinfo
    _connect = socket.socket.connect
    _connect_ex = socket.socket.connect_ex

    def getaddrinfo(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if not _local(host):
            _refuse(f"lookup {host}")
        return _getaddrinfo(host, *args, **kwargs)

    def _check(sock: socket.socket, address: object) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and \
                not _local(address[0]):
            _refuse(f"connect {address[0]}:{address[1]}")

    def connect(self, address):  # type: ignore[no-untyped-def]
        _check(self, address)
        return _connect(self, address)

    def connect_ex(self, address):  # type: ignore[no-untyped-def]
        _check(self, address)
        return _connect_ex(self, address)

    socket.getaddrinfo = getaddrinfo
    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign]
