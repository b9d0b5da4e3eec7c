"""The SSH runner: commands on another machine over one multiplexed SSH connection.

:class:`SshRunner` implements :class:`~flowmesh_sdk.remote.runner.Runner` on a
``fabric.Connection`` (:mod:`.connection`): the user's ssh config applies (host aliases,
``User``, ``Port``, ``IdentityFile``, ``ProxyJump`` chains, ``ConnectTimeout``), keys come
from the target, the config or the ssh-agent, and every hop's host key is decided by
:class:`~flowmesh_sdk.remote.trust.HostTrust` (pinned, the user's known_hosts, trust on
first use only when asked for; never auto-added).  One connection per runner is opened
lazily and reused: every :meth:`run`, :meth:`open_channel` and SFTP transfer is a new
session channel on its transport.  Past ``max_sessions`` channels at once (sshd's
``MaxSessions``) a second connection is opened, and so on up to ``max_connections``.
When a connection has died it is opened again (once per call, after a short backoff).
:class:`SshTarget` (:mod:`.ssh_target`) and the channel classes (:mod:`.ssh_channel`) live
beside it and are importable from here too.

With ``SshTarget(sudo=True)`` every command runs as root through sudo (:mod:`.sudo`):
passwordless, or answering sudo's prompt with ``sudo_password`` (never logged).

Every blocking call (fabric, paramiko) runs in a bounded pool of worker threads, and
each channel's stdout and stderr are pumped by a reader thread into asyncio
``StreamReader`` objects (``loop.call_soon_threadsafe``), so the event loop never blocks.
Each wait has a deadline.  The private key stays in its file; only its path appears in
reprs and messages.

Remote commands run as ``sh -c 'echo $$; exec "$@"' ...`` from the session's shell,
which OpenSSH made a session leader (else, and under sudo, under ``setsid -w``): the
command leads its own process group, whose id comes back as the first stdout line; on a
timeout (or when a channel is closed and its process does not exit) ``kill -KILL -PGID``
(``sh``'s builtin: dash's and busybox's take no ``--``) goes out over a second session
channel, so the whole remote tree dies, and the kill waits (at most 5 s) until the group
is gone.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from .. import timers
from ..errors import AuthError, ProviderUnavailableError, SandboxClosedError, SpecError
from . import connection
from .keys import PublicKey
from .runner import Channel, CommandResult, Runner
from .ssh_channel import _READ_CHUNK, SshChannel, _blocking, _Conn, _Proc, _wrap
from .ssh_target import SshTarget
from .sudo import Sudo
from .trust import HostTrust

try:  # fabric and paramiko are the optional extra ``ssh``
    import paramiko
except ImportError:  # pragma: no cover - exercised only without the extra
    paramiko = None

__all__ = ["MAX_OPENING", "SshChannel", "SshRunner", "SshTarget"]

log = logging.getLogger("flowmesh.remote.ssh")

#: SSH handshakes in flight at once in this process (key exchanges cost CPU: a pool bringing
#: up many machines together opens their connections this many at a time)
MAX_OPENING = 16
_OPENING = threading.BoundedSemaphore(MAX_OPENING)

_KILL_GRACE_S = 5.0       # after a kill, how long to wait for the streams to end
_RECONNECT_BACKOFF_S = 0.5


def _need_paramiko() -> None:
    connection.need_fabric()


class SshRunner(Runner):
    """Runs commands on ``target`` over one SSH connection (fabric), multiplexed."""

    on_this_host = False

    def __init__(self, target: SshTarget, *, connect_timeout_s: float | None = None,
                 keepalive_s: float = 15.0, max_sessions: int = 10, max_connections: int = 8,
                 trust: HostTrust | None = None, sudo_password: str | None = None) -> None:
        """``max_sessions`` caps concurrent session channels per connection (OpenSSH's
        ``MaxSessions`` is 10 by default).  Held-open channels past it make the runner open
        another connection to the machine, up to ``max_connections`` (so a machine can hold
        more sandbox channels than one connection allows); commands past it, and channels
        past all connections, wait for a slot to be given back.

        ``connect_timeout_s`` None: the ssh config's ``ConnectTimeout``, else 10 s.
        ``trust`` decides on host keys when ``target.host_key`` pins none (default: the
        user's known_hosts, no trust on first use).  ``sudo_password`` answers sudo's
        prompt when ``target.sudo`` is set (None: passwordless sudo)."""
        _need_paramiko()
        self.target = target
        if target.host_key:
            try:
                pinned = PublicKey.parse(target.host_key, field_name="ssh.host_key")
            except SpecError as exc:
                raise AuthError(f"{target.label}: the pinned host key must be '<type> <base64>': {exc}",
                                provider="ssh") from exc
            self.trust = dataclasses.replace(trust or HostTrust(), pinned=pinned)
        else:
            self.trust = trust or HostTrust()
        self.sudo = Sudo(sudo_password) if target.sudo else None
        self.label = target.label
        self._timeout_given = connect_timeout_s
        self.connect_timeout_s = connect_timeout_s or connection.DEFAULT_CONNECT_TIMEOUT_S
        self.keepalive_s = keepalive_s
        self.max_sessions = max_sessions
        self.max_connections = max_connections
        self._conns: list[_Conn] = []
        self._freed = asyncio.Event()   # a session slot was given back
        self._closed = False
        self._resolved: connection.Resolved | None = None
        #: how many SSH connections this runner has opened (1 while it never had to reconnect)
        self.connects = 0

    def __repr__(self) -> str:
        return f"SshRunner({self.label}, key={self.target.key_path}, sudo={self.sudo})"

    @property
    def resolved_user(self) -> str:
        return self._resolved.user if self._resolved else (self.target.user or "the login user")

    # ---- the connection ------------------------------------------------------------
    def _build(self) -> Any:
        """The fabric Connection (ssh config applied, nothing opened); the label and
        timeout follow what the config resolved."""
        c = connection.build(self.target, self._timeout_given)
        r = self._resolved = connection.resolve(c)
        where = f"{r.user}@{r.host}:{r.port}"
        self.label = where if self.target.host == r.host else f"{self.target.host} ({where})"
        if self._timeout_given is None:
            self.connect_timeout_s = r.connect_timeout_s
        return c

    def _connect_blocking(self) -> Any:
        c = self._build()
        with _OPENING:
            return connection.open_connection(c, self.trust, keepalive_s=self.keepalive_s)

    async def _take_slot(self, *, grow: bool, timeout_s: float = 300.0) -> _Conn:
        """A session slot on a connection with room.  Only ``grow`` callers (held-open
        channels) open a further connection when all are full; commands wait for a slot
        instead (so a burst of short commands stays on one connection).  Waits for a
        slot given back, up to ``timeout_s`` (asyncio.TimeoutError past it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            conn = next((c for c in self._conns if c.busy < self.max_sessions), None)
            if conn is None and (not self._conns or (grow and len(self._conns) < self.max_connections)):
                conn = _Conn()
                self._conns.append(conn)
            if conn is not None:
                conn.busy += 1
                return conn
            self._freed.clear()
            async with timers.timeout(max(0.0, deadline - time.monotonic())):
                await self._freed.wait()

    def _give_slot(self, conn: _Conn) -> None:
        conn.busy -= 1
        self._freed.set()

    async def _drop(self, conn: _Conn) -> None:
        if conn.cxn is not None:
            cxn, conn.cxn = conn.cxn, None
            await _blocking(connection.close_connection, cxn)

    async def _get_transport(self, conn: _Conn, *, fresh: bool = False) -> Any:
        if self._closed:
            raise SandboxClosedError(f"{self.label}: the runner is closed")
        async with conn.lock:
            t = conn.transport
            if fresh or (t is not None and not t.is_active()):
                await self._drop(conn)
                t = None
            if t is None:
                limit = self.connect_timeout_s * 3
                try:
                    cxn = await asyncio.wait_for(_blocking(self._connect_blocking), limit)
                except asyncio.TimeoutError as exc:
                    raise ProviderUnavailableError(f"{self.label}: no SSH connection within {limit:g} s",
                                                   provider="ssh") from exc
                conn.cxn = cxn
                t = cxn.transport
                self.connects += 1
            return t

    async def _with_transport(self, conn: _Conn, fn: Any, timeout_s: float | None = None) -> Any:
        """``fn(transport)`` in a thread; when the connection turns out dead, reconnect
        once after a backoff and try again."""
        limit = timeout_s if timeout_s is not None else self.connect_timeout_s * 3
        t = await self._get_transport(conn)
        try:
            return await asyncio.wait_for(_blocking(fn, t), limit)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if isinstance(exc, paramiko.ChannelException) or t.is_active():
                raise ProviderUnavailableError(f"{self.label}: {exc}", provider="ssh") from exc
            log.info("%s: connection lost (%s); reconnecting", self.label, exc)
        await asyncio.sleep(_RECONNECT_BACKOFF_S)
        t = await self._get_transport(conn, fresh=True)
        return await asyncio.wait_for(_blocking(fn, t), limit)

    async def wait_reachable(self, timeout_s: float) -> None:
        """A machine just booted: probe its port (a cheap TCP connect, backing off from
        0.2 s to 2 s) until sshd answers with its banner, then run ``true`` over the
        connection.  A machine behind jump hosts (or a ProxyCommand) is not probed: the
        first connection through them is the probe.  A refused host key is not retried:
        it fails at once."""
        deadline = time.monotonic() + timeout_s
        if self._resolved is None:
            await _blocking(self._build)
        delay = 0.2
        while self._resolved is not None and self._resolved.direct:
            try:
                await asyncio.wait_for(_blocking(self._banner), max(0.5, delay * 2))
                break
            except (OSError, asyncio.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise ProviderUnavailableError(f"{self.label}: no SSH server within {timeout_s:g} s "
                                                   f"({type(exc).__name__}: {exc})", provider="ssh") from exc
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
        await super().wait_reachable(max(1.0, deadline - time.monotonic()))

    async def probe(self, timeout_s: float) -> None:
        """``true`` on a new session channel of every open connection -- the transports
        that carry the held-open sandbox channels, so sshd and the host are tested with
        them -- taking no session slot (a connection full of held-open channels is probed
        too, at once).  sshd refusing the channel (its ``MaxSessions``) is an answer: the
        machine is up.  With no connection open, the plain :meth:`Runner.probe`."""
        conns = [c for c in self._conns if c.transport is not None and c.transport.is_active()]
        if not conns:
            return await super().probe(timeout_s)

        async def one(conn: _Conn) -> None:
            try:
                code = await self._exec_simple(["true"], timeout_s, conn)
            except ProviderUnavailableError as exc:
                if isinstance(exc.__cause__, paramiko.ChannelException):
                    return   # sshd answered, with a refusal
                raise
            if code != 0:
                raise ProviderUnavailableError(f"{self.label}: `true` ended with {code}", provider="ssh")

        try:
            async with timers.timeout(timeout_s):
                await asyncio.gather(*(one(c) for c in conns))
        except TimeoutError as exc:
            raise ProviderUnavailableError(f"{self.label}: `true` got no answer within {timeout_s:g} s",
                                           provider="ssh") from exc

    def _banner(self) -> None:
        r = self._resolved
        assert r is not None
        with socket.create_connection((r.host, r.port), timeout=2.0) as s:
            s.settimeout(2.0)
            if not s.recv(4).startswith(b"SSH-"):
                raise OSError("the port answers, but not with an SSH banner")

    async def _start(self, argv: Sequence[str], conn: _Conn) -> _Proc:
        """A session channel running ``argv`` (wrapped; through sudo when the target
        says so); the caller holds a slot on ``conn`` (or is killing on it)."""
        cmd = _wrap(argv, self.sudo)

        def open_exec(t: Any) -> Any:
            chan = t.open_session(timeout=self.connect_timeout_s)
            try:
                chan.exec_command(cmd)
            except BaseException:
                chan.close()
                raise
            return chan

        chan = await self._with_transport(conn, open_exec)
        proc = _Proc(self, conn, chan, argv)
        try:
            await proc.read_pgid(self.connect_timeout_s * 3)
        except BaseException:
            proc.close()
            raise
        return proc

    async def _exec_simple(self, argv: Sequence[str], timeout_s: float, conn: _Conn) -> int | None:
        """Run ``argv`` on ``conn`` without taking a slot (used to kill) and wait."""
        proc = await self._start(argv, conn)
        try:
            await proc.send_eof()
            return await proc.wait_exit(timeout_s)
        finally:
            proc.close()

    # ---- Runner --------------------------------------------------------------------
    async def run(self, argv: Sequence[str], *, timeout_s: float,
                  input: bytes | None = None) -> CommandResult:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        timed_out = False
        conn = await self._take_slot(grow=False)
        try:
            proc = await self._start(argv, conn)
            try:
                async def feed() -> None:
                    try:
                        if input:
                            await proc.write(input)
                        await proc.send_eof()
                    except (OSError, EOFError, paramiko.SSHException):
                        pass  # the command stopped reading (or exited): like a broken pipe

                out_buf, err_buf = bytearray(), bytearray()
                feeder = asyncio.create_task(feed())
                drains = [asyncio.create_task(_drain(proc.stdout, out_buf)),
                          asyncio.create_task(_drain(proc.stderr, err_buf))]
                try:
                    try:
                        # asyncio.wait, not wait_for: the drains must outlive a timeout
                        await asyncio.wait(drains, timeout=max(0.0, deadline - time.monotonic()))
                        if not all(d.done() for d in drains):
                            raise asyncio.TimeoutError
                        code = await proc.wait_exit(max(0.1, deadline - time.monotonic()))
                        if code is None and not proc.exited():
                            raise asyncio.TimeoutError
                        await asyncio.wait([feeder], timeout=5.0)
                    except asyncio.TimeoutError:
                        timed_out = True
                        code = -9
                        feeder.cancel()
                        await proc.kill()
                        # what the tree wrote before it died; the streams end with it
                        await asyncio.wait([d for d in drains if not d.done()] or [feeder],
                                           timeout=_KILL_GRACE_S)
                        # and the wrappers above the group (setsid -w, sudo) have exited: sudo
                        # closes the streams before its own cleanup, and a run that returned
                        # then left a `sudo ... sleep 301` to be seen by the next command
                        await proc.wait_exit(_KILL_GRACE_S)
                finally:
                    for task in (*drains, feeder):
                        task.cancel()
                out, err = bytes(out_buf), bytes(err_buf)
                if not timed_out and code is None and proc.lost():
                    raise ProviderUnavailableError(
                        f"{self.label}: the SSH connection was lost while `{shlex.join(argv)[:200]}` ran "
                        "(its exit status is unknown; it may still run on the machine)",
                        provider="ssh", code="ConnectionLost")
            except BaseException:
                if not proc.exited():
                    await asyncio.shield(proc.kill())
                raise
            finally:
                proc.close()
        finally:
            self._give_slot(conn)
        return CommandResult(tuple(argv), code if code is not None else -1, out, err,
                             time.monotonic() - t0, timed_out)

    async def open_channel(self, argv: Sequence[str]) -> Channel:
        conn = await self._take_slot(grow=True)
        try:
            proc = await self._start(argv, conn)
        except BaseException:
            self._give_slot(conn)
            raise
        return SshChannel(proc)

    async def _sftp(self, op: str, a: str, b: str, timeout_s: float) -> None:
        """One SFTP transfer on its own SFTP channel; an upload is created 0600 before
        its first byte is written (credentials never sit readable by others)."""
        def go(t: Any) -> None:
            sftp = paramiko.SFTPClient.from_transport(t)
            try:
                sftp.get_channel().settimeout(max(60.0, self.connect_timeout_s * 6))
                if op == "put":
                    with open(a, "rb") as src, sftp.open(b, "wb") as dst:
                        dst.chmod(0o600)
                        dst.set_pipelined(True)
                        while chunk := src.read(1 << 15):
                            dst.write(chunk)
                else:
                    sftp.get(a, b)
            finally:
                sftp.close()
        conn = await self._take_slot(grow=False)
        try:
            await self._with_transport(conn, go, timeout_s)
        finally:
            self._give_slot(conn)

    async def _as_root(self, script: str, *args: str) -> None:
        res = await self.run(["sh", "-c", script, "fm-file", *args], timeout_s=120)
        if not res.ok:
            raise ProviderUnavailableError(f"{self.label}: {res.describe()}", provider="ssh")

    async def put_file(self, local_path: str, remote_path: str, *, timeout_s: float = 3600.0) -> None:
        if self.sudo is None:
            await self._sftp("put", local_path, remote_path, timeout_s)
            return
        # SFTP writes as the login user: into a private temporary file, then moved into
        # place as root (and owned by root)
        tmp = f"/tmp/.fm-put-{os.urandom(8).hex()}"
        try:
            await self._sftp("put", local_path, tmp, timeout_s)
            await self._as_root('mv -f -- "$1" "$2" && chown 0:0 -- "$2"', tmp, remote_path)
        except BaseException:
            await asyncio.shield(self._as_root('rm -f -- "$1"', tmp))
            raise

    async def get_file(self, remote_path: str, local_path: str, *, timeout_s: float = 3600.0) -> None:
        if self.sudo is None:
            await self._sftp("get", remote_path, local_path, timeout_s)
            return
        tmp = f"/tmp/.fm-get-{os.urandom(8).hex()}"
        try:
            await self._as_root('umask 077 && cp -- "$1" "$2" && chown "$SUDO_UID" -- "$2"', remote_path, tmp)
            await self._sftp("get", tmp, local_path, timeout_s)
        finally:
            await asyncio.shield(self._as_root('rm -f -- "$1"', tmp))

    async def close(self) -> None:
        self._closed = True
        for conn in self._conns:
            async with conn.lock:
                await self._drop(conn)


async def _drain(reader: asyncio.StreamReader, buf: bytearray) -> None:
    while data := await reader.read(_READ_CHUNK):
        buf += data
