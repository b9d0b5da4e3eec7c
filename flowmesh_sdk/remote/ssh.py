"""The SSH runner: commands on another machine over one multiplexed SSH connection.

:class:`SshRunner` implements :class:`~flowmesh_sdk.remote.runner.Runner` with paramiko.
One ``paramiko.Transport`` per runner is opened lazily and reused: every :meth:`run`,
:meth:`open_channel` and SFTP transfer is a new session channel on it.  Past
``max_sessions`` channels at once (sshd's ``MaxSessions``) a second connection is opened,
and so on up to ``max_connections``.  When a connection has died it is opened again
(once per call, after a short backoff).

Host keys are pinned: :class:`SshTarget` carries the one public host key line the SDK
expects (``ssh-ed25519 AAAA...``).  Any other key fails with :class:`AuthError` before
authentication starts; nothing is ever added to a known-hosts file (only a target with
no pinned key and a ``host_key_check`` -- trust on first use, :mod:`.keys` -- defers the
decision to that check).  The private key
stays in its file; only its path appears in reprs and messages.

Every blocking paramiko call runs in a worker thread, and each channel's stdout and
stderr are pumped by a reader thread into asyncio ``StreamReader`` objects
(``loop.call_soon_threadsafe``), so the event loop never blocks.  Each wait has a deadline.

Remote commands run as ``sh -c 'echo $$; exec "$@"' ...`` from the session's shell,
which OpenSSH made a session leader (else under ``setsid -w``): the command leads
its own process group, whose id comes back as the first stdout line; on a timeout (or
when a channel is closed and its process does not exit) ``kill -KILL -- -PGID`` goes
out over a second session channel, so the whole remote tree dies.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shlex
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthError, ProviderUnavailableError, SandboxClosedError
from .runner import Channel, CommandResult, Runner, StreamChannel

try:  # paramiko is an optional dependency (extra ``ssh``)
    import paramiko
except ImportError:  # pragma: no cover - exercised only without the extra
    paramiko = None  # type: ignore[assignment]

log = logging.getLogger("flowmesh.remote.ssh")

_READ_CHUNK = 65536
_KILL_GRACE_S = 5.0       # after a kill, how long to wait for the streams to end
_CLOSE_GRACE_S = 2.0      # a closed channel's process gets this long to exit on EOF
_RECONNECT_BACKOFF_S = 0.5


def _wrap(argv: Sequence[str]) -> str:
    """The remote command line: ``argv`` as the leader of a new process group whose id is
    printed first on stdout."""
    inner = "sh -c 'echo $$; exec \"$@\"' fm-run " + shlex.join(argv)
    # OpenSSH starts every session command in a new session (setsid), so the shell
    # already leads its group; ``setsid -w`` only when it does not (it forks and, when
    # the child is killed, writes a line to stderr, which the first form avoids).
    return ('if [ "$(cut -d" " -f5 /proc/$$/stat 2>/dev/null)" = "$$" ]; '
            f"then exec {inner}; else exec setsid -w {inner}; fi")


@dataclass(frozen=True, slots=True)
class SshTarget:
    """Where and how to reach a machine.  ``key_path`` is the client's private key file
    (never its contents); ``host_key`` is the server's expected public key line
    (``ssh-ed25519 AAAA...``, an optional trailing comment is ignored)."""

    host: str
    port: int
    user: str
    key_path: str
    host_key: str = field(repr=False)

    @property
    def label(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def pinned_key(self) -> tuple[str, bytes]:
        parts = self.host_key.split()
        if len(parts) < 2:
            raise AuthError(f"{self.label}: the pinned host key must be '<type> <base64>'",
                            provider="ssh")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except ValueError as exc:
            raise AuthError(f"{self.label}: the pinned host key is not base64", provider="ssh") from exc
        return parts[0], blob


def _need_paramiko() -> None:
    if paramiko is None:
        raise ImportError("the SSH runner needs paramiko: pip install 'flowmesh-sdk[ssh]' "
                          "(or pip install paramiko)")


class _Pump:
    """Reads one side of a paramiko channel in a thread and feeds an asyncio StreamReader."""

    def __init__(self, loop: asyncio.AbstractEventLoop, chan: Any, stderr: bool,
                 reader: asyncio.StreamReader, on_line: Any = None) -> None:
        self._loop = loop
        self._chan = chan
        self._stderr = stderr
        self._reader = reader
        self._on_line = on_line
        self.done = threading.Event()
        threading.Thread(target=self._run, daemon=True,
                         name=f"fm-ssh-{'err' if stderr else 'out'}").start()

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _run(self) -> None:
        recv = self._chan.recv_stderr if self._stderr else self._chan.recv
        try:
            while True:
                data = recv(_READ_CHUNK)
                if not data:
                    break
                self._call(self._reader.feed_data, data)
                if self._on_line is not None:
                    self._on_line(data)
        except Exception:  # noqa: BLE001 - a dead transport ends the stream like EOF
            pass
        finally:
            self.done.set()
            self._call(self._reader.feed_eof)


class _Proc:
    """A remote process on a session channel: its streams, its exit status, its pgid."""

    def __init__(self, runner: SshRunner, conn: _Conn, chan: Any, argv: Sequence[str]) -> None:
        self.runner = runner
        self.conn = conn
        self.chan = chan
        self.argv = tuple(argv)
        loop = asyncio.get_running_loop()
        self.stdout = asyncio.StreamReader(limit=1 << 20)
        self.stderr = asyncio.StreamReader(limit=1 << 20)
        self._out = _Pump(loop, chan, False, self.stdout)
        self._err = _Pump(loop, chan, True, self.stderr)
        self.pgid: int | None = None

    async def read_pgid(self, timeout_s: float) -> None:
        line = await asyncio.wait_for(self.stdout.readline(), timeout_s)
        try:
            self.pgid = int(line.strip())
        except ValueError as exc:
            err = await _read_some(self.stderr, 1.0)
            raise ProviderUnavailableError(
                f"{self.runner.label}: the remote command did not start "
                f"({line[:200]!r} {err.decode('utf-8', 'replace')[:400]})", provider="ssh") from exc

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(self.chan.sendall, data)

    async def send_eof(self) -> None:
        await asyncio.to_thread(self.chan.shutdown_write)

    def exited(self) -> bool:
        return self.chan.exit_status_ready()

    async def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None if there is none within ``timeout_s`` (or it was
        killed by a signal / the connection died)."""
        ok = await asyncio.to_thread(self.chan.status_event.wait, timeout_s)
        if not ok:
            return None
        status = self.chan.exit_status
        return None if status == -1 else status

    async def kill(self) -> None:
        if self.pgid is not None and self.pgid > 1:
            try:
                await self.runner._exec_simple(f"kill -KILL -- -{self.pgid} 2>/dev/null; true", 15.0,
                                               self.conn)
            except Exception as exc:  # noqa: BLE001 - best effort; logged
                log.warning("%s: could not kill remote process group %s: %s",
                            self.runner.label, self.pgid, exc)

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001
            pass


async def _read_some(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(4096), timeout_s)
    except asyncio.TimeoutError:
        return b""


class SshChannel(StreamChannel):
    def __init__(self, proc: _Proc) -> None:
        super().__init__(proc.stdout, proc.stderr)
        self._proc = proc
        self._closed = False

    async def write(self, data: bytes) -> None:
        if not self.alive:
            raise SandboxClosedError(f"channel process exited: {self.stderr_tail()}")
        try:
            await self._proc.write(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise SandboxClosedError(f"channel closed: {self.stderr_tail()}") from exc

    @property
    def alive(self) -> bool:
        chan = self._proc.chan
        return (not self._closed and not chan.closed and not chan.exit_status_ready()
                and chan.get_transport() is not None and chan.get_transport().is_active())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        proc = self._proc
        try:
            if not proc.exited():
                try:
                    await proc.send_eof()
                except Exception:  # noqa: BLE001
                    pass
                if await proc.wait_exit(_CLOSE_GRACE_S) is None and not proc.exited():
                    await proc.kill()
        finally:
            proc.close()
            self.runner_release()
            self._drain.cancel()

    def runner_release(self) -> None:
        self._proc.runner._give_slot(self._proc.conn)


class _Conn:
    """One SSH connection of a runner, and how many session slots are taken on it."""

    __slots__ = ("transport", "busy", "lock")

    def __init__(self) -> None:
        self.transport: Any = None
        self.busy = 0
        self.lock = asyncio.Lock()


class SshRunner(Runner):
    """Runs commands on ``target`` over one SSH connection (paramiko), multiplexed."""

    on_this_host = False

    def __init__(self, target: SshTarget, *, connect_timeout_s: float = 10.0,
                 keepalive_s: float = 15.0, max_sessions: int = 10, max_connections: int = 8,
                 host_key_check: Callable[[str, int, str, bytes], None] | None = None) -> None:
        """``max_sessions`` caps concurrent session channels per connection (OpenSSH's
        ``MaxSessions`` is 10 by default).  Held-open channels past it make the runner open
        another connection to the machine, up to ``max_connections`` (so a machine can hold
        more sandbox channels than one connection allows); commands past it, and channels
        past all connections, wait for a slot to be given back.  ``host_key_check(host,
        port, key_type, key_blob)`` decides on the server's key when ``target.host_key``
        is empty (trust on first use: :meth:`flowmesh_sdk.remote.keys.KnownHosts.tofu_check`);
        it returns to accept and raises AuthError to refuse."""
        _need_paramiko()
        self.target = target
        self.host_key_check = host_key_check
        self.label = target.label
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.max_sessions = max_sessions
        self.max_connections = max_connections
        self._conns: list[_Conn] = []
        self._freed = asyncio.Event()   # a session slot was given back
        self._closed = False
        #: how many SSH connections this runner has opened (1 while it never had to reconnect)
        self.connects = 0

    def __repr__(self) -> str:
        return f"SshRunner({self.label}, key={self.target.key_path})"

    # ---- the connection ------------------------------------------------------------
    def _connect_blocking(self) -> Any:
        t = self.target
        tofu = not t.host_key and self.host_key_check is not None
        key_type, key_blob = ("", b"") if tofu else t.pinned_key()
        try:
            sock = socket.create_connection((t.host, t.port), timeout=self.connect_timeout_s)
        except OSError as exc:
            raise ProviderUnavailableError(f"{self.label}: cannot connect: {exc}", provider="ssh") from exc
        transport = paramiko.Transport(sock)
        try:
            opts = transport.get_security_options()
            if tofu:
                wanted = list(opts.key_types)   # no pinned key: the check decides after the handshake
            elif key_type == "ssh-rsa":
                wanted = ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"]
            else:
                wanted = [key_type]
            usable = [k for k in wanted if k in opts.key_types]
            if not usable:
                raise AuthError(f"{self.label}: pinned host key type {key_type!r} is not "
                                "supported by paramiko", provider="ssh")
            opts.key_types = usable  # negotiate the pinned kind of key only
            transport.banner_timeout = self.connect_timeout_s
            transport.auth_timeout = self.connect_timeout_s
            try:
                transport.start_client(timeout=self.connect_timeout_s)
            except paramiko.SSHException as exc:
                if "Incompatible ssh" in str(exc) or "no acceptable host key" in str(exc):
                    raise AuthError(f"{self.label}: the server offers no {key_type} host key "
                                    f"(pinned): {exc}", provider="ssh") from exc
                raise ProviderUnavailableError(f"{self.label}: SSH handshake failed: {exc}",
                                               provider="ssh") from exc
            server_key = transport.get_remote_server_key()
            if tofu:
                self.host_key_check(t.host, t.port, server_key.get_name(), server_key.asbytes())
            elif server_key.get_name() != key_type or server_key.asbytes() != key_blob:
                raise AuthError(
                    f"{self.label}: host key mismatch: the server presented "
                    f"{server_key.get_name()} SHA256:{_fp(server_key.asbytes())}, the pinned key is "
                    f"{key_type} SHA256:{_fp(key_blob)}; refusing to connect", provider="ssh")
            try:
                pkey = paramiko.PKey.from_path(t.key_path)
            except (OSError, paramiko.SSHException, ValueError) as exc:
                raise AuthError(f"{self.label}: cannot load the private key {t.key_path}: "
                                f"{type(exc).__name__}", provider="ssh") from exc
            try:
                transport.auth_publickey(t.user, pkey)
            except paramiko.AuthenticationException as exc:
                raise AuthError(f"{self.label}: the server refused the key {t.key_path} "
                                f"for {t.user}", provider="ssh") from exc
            except paramiko.SSHException as exc:
                raise ProviderUnavailableError(f"{self.label}: authentication failed: {exc}",
                                               provider="ssh") from exc
            if self.keepalive_s:
                transport.set_keepalive(int(max(1, self.keepalive_s)))
            return transport
        except BaseException:
            transport.close()
            raise

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
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await self._freed.wait()

    def _give_slot(self, conn: _Conn) -> None:
        conn.busy -= 1
        self._freed.set()

    async def _get_transport(self, conn: _Conn, *, fresh: bool = False) -> Any:
        if self._closed:
            raise SandboxClosedError(f"{self.label}: the runner is closed")
        async with conn.lock:
            t = conn.transport
            if fresh and t is not None:
                await asyncio.to_thread(t.close)
                conn.transport = t = None
            if t is None or not t.is_active():
                if t is not None:
                    await asyncio.to_thread(t.close)
                    conn.transport = None
                t = await asyncio.wait_for(asyncio.to_thread(self._connect_blocking),
                                           self.connect_timeout_s * 3)
                conn.transport = t
                self.connects += 1
            return t

    async def _with_transport(self, conn: _Conn, fn: Any, timeout_s: float | None = None) -> Any:
        """``fn(transport)`` in a thread; when the connection turns out dead, reconnect
        once after a backoff and try again."""
        limit = timeout_s if timeout_s is not None else self.connect_timeout_s * 3
        t = await self._get_transport(conn)
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, t), limit)
        except (EOFError, OSError, paramiko.SSHException) as exc:
            if isinstance(exc, paramiko.ChannelException) or t.is_active():
                raise ProviderUnavailableError(f"{self.label}: {exc}", provider="ssh") from exc
            log.info("%s: connection lost (%s); reconnecting", self.label, exc)
        await asyncio.sleep(_RECONNECT_BACKOFF_S)
        t = await self._get_transport(conn, fresh=True)
        return await asyncio.wait_for(asyncio.to_thread(fn, t), limit)

    async def wait_reachable(self, timeout_s: float) -> None:
        """A machine just booted: probe its port (a cheap TCP connect, backing off from
        0.2 s to 2 s) until sshd answers with its banner, then run ``true`` over the
        connection.  A refused host key is not retried: it fails at once."""
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            try:
                await asyncio.wait_for(asyncio.to_thread(self._banner), max(0.5, delay * 2))
                break
            except (OSError, asyncio.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise ProviderUnavailableError(f"{self.label}: no SSH server within {timeout_s:g} s "
                                                   f"({type(exc).__name__}: {exc})", provider="ssh") from exc
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)
        await super().wait_reachable(max(1.0, deadline - time.monotonic()))

    def _banner(self) -> None:
        with socket.create_connection((self.target.host, self.target.port), timeout=2.0) as s:
            s.settimeout(2.0)
            if not s.recv(4).startswith(b"SSH-"):
                raise OSError("the port answers, but not with an SSH banner")

    async def _start(self, argv: Sequence[str], conn: _Conn) -> _Proc:
        """A session channel running ``argv`` (wrapped); the caller holds a slot on ``conn``."""
        cmd = _wrap(argv)

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

    async def _exec_simple(self, command: str, timeout_s: float, conn: _Conn) -> int | None:
        """Run a shell line on ``conn`` (unwrapped, no slot needed: used to kill) and wait."""
        def go(t: Any) -> int:
            chan = t.open_session(timeout=self.connect_timeout_s)
            try:
                chan.exec_command(command)
                chan.shutdown_write()
                if not chan.status_event.wait(timeout_s):
                    return -1
                return chan.exit_status
            finally:
                chan.close()
        return await self._with_transport(conn, go, timeout_s + self.connect_timeout_s * 2)

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

                out, err = bytearray(), bytearray()
                feeder = asyncio.create_task(feed())
                drains = [asyncio.create_task(_drain(proc.stdout, out)),
                          asyncio.create_task(_drain(proc.stderr, err))]
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
                finally:
                    for task in (*drains, feeder):
                        task.cancel()
                out, err = bytes(out), bytes(err)
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
        def go(t: Any) -> None:
            sftp = paramiko.SFTPClient.from_transport(t)
            try:
                sftp.get_channel().settimeout(max(60.0, self.connect_timeout_s * 6))
                if op == "put":
                    sftp.put(a, b)
                else:
                    sftp.get(a, b)
            finally:
                sftp.close()
        conn = await self._take_slot(grow=False)
        try:
            await self._with_transport(conn, go, timeout_s)
        finally:
            self._give_slot(conn)

    async def put_file(self, local_path: str, remote_path: str, *, timeout_s: float = 3600.0) -> None:
        await self._sftp("put", local_path, remote_path, timeout_s)

    async def get_file(self, remote_path: str, local_path: str, *, timeout_s: float = 3600.0) -> None:
        await self._sftp("get", remote_path, local_path, timeout_s)

    async def close(self) -> None:
        self._closed = True
        for conn in self._conns:
            async with conn.lock:
                if conn.transport is not None:
                    await asyncio.to_thread(conn.transport.close)
                    conn.transport = None


async def _drain(reader: asyncio.StreamReader, buf: bytearray) -> None:
    while data := await reader.read(_READ_CHUNK):
        buf += data


def _fp(blob: bytes) -> str:
    import hashlib
    return base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
