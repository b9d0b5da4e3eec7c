"""The :class:`Sandbox`: one container, driven through its agent (see the package's
docstring, :mod:`flowmesh_sdk.sandbox`, for what it promises)."""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import posixpath
import tarfile
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, overload

from ..backoff import is_loopback_host
from ..errors import SandboxClosedError, SandboxFileError, SpecError
from ..remote.runner import Channel
from ..remote.runtime import ContainerRuntime
from ..specs import ExecResult, SandboxSpec, check_number, frozen_env
from ._channels import EXEC_CHANNELS, AgentChannels
from ._common import DEFAULT_OUTPUT_CAP, _Agent, _check_command, _check_path, _env_prefix, _result, sh_quote
from .process import Process, _pump
from .session import Session
from .terminal import Terminal, open_terminal

FILE_CAP = 256 << 20                  # read_file limit, and write_file's
_FILE_TIMEOUT_S = 300.0
AGENT_FAILED = 125                    # exit code when the agent could not run a command

__all__ = ["AGENT_FAILED", "EXEC_CHANNELS", "FILE_CAP", "ExecResult", "Sandbox"]


class Sandbox:
    """An isolated container.  Use ``async with`` or call :meth:`close`.

    Commands may run concurrently: each runs on a channel of its own (up to
    ``EXEC_CHANNELS`` for ``exec`` and the file calls, any number of :meth:`start`
    processes and :meth:`session` shells).  The channels are an :class:`AgentChannels`
    the sandbox owns (``_channels``).  ``shell``: a shell channel that came with the
    container (:meth:`ContainerRuntime.start`), where the first agent starts.
    """

    def __init__(self, runtime: ContainerRuntime, container_id: str, name: str,
                 spec: SandboxSpec, *, instance_id: str = "", image_id: str = "",
                 shell: Channel | None = None) -> None:
        self.runtime = runtime
        self.container_id = container_id
        self.name = name
        self.instance_id = instance_id
        self.image_id = image_id
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._sessions: dict[str, Session] = {}
        # dicts used as sets: an empty dict is not tracked by the collector, an empty set is
        self._procs: dict[Process, None] = {}
        self._tasks: dict[asyncio.Task[object], None] = {}
        # the channels hold the spec (each agent's start reads it) and nothing holds the
        # sandbox back: a closed sandbox is freed when its last reference goes, not left for
        # the collector's full passes (issue 29)
        self._channels = AgentChannels(runtime, container_id, name, spec=spec, ids=self._ids,
                                       limit=EXEC_CHANNELS, shell=shell)

    @property
    def spec(self) -> SandboxSpec:
        """The sandbox's spec; a pool hands a warm sandbox its taker's (the same shape, the
        taker's env and timeouts), which the next agent started reads."""
        return self._channels.spec

    @spec.setter
    def spec(self, spec: SandboxSpec) -> None:
        self._channels.spec = spec

    def __repr__(self) -> str:
        return f"Sandbox({self.name}, image={self.spec.image!r}, instance={self.instance_id})"

    # ---- lifecycle -------------------------------------------------------------
    async def open(self) -> Sandbox:
        """Open the first command channel (idempotent; ``start()`` with no command and
        ``async with`` do this)."""
        if self._channels.closed:
            raise SandboxClosedError(f"{self.name} is closed")
        async with self._start_lock:
            await self._channels.prime()
        return self

    @property
    def closed(self) -> bool:
        return self._channels.closed

    async def close(self) -> None:
        """Destroy the container (idempotent).  Every session, process and background job
        in it ends with it (SIGKILL, with the container)."""
        if self._channels.closed:
            return
        await self._channels.close()
        try:
            await self.runtime.remove([self.container_id])   # terminals' channels end with it
        finally:
            for s in list(self._sessions.values()):
                await s._drop()
            for p in list(self._procs):
                await p._lost(SandboxClosedError(f"{self.name} was closed"))
            for t in list(self._tasks):
                t.cancel()
            self._channels.wake()

    def abort(self, exc: Exception) -> None:
        """The instance under this sandbox was declared lost (its machine stopped
        answering): every call waiting on one of its channels -- ``exec``, a
        :class:`Session` command, a :class:`Process` -- raises ``exc`` now (a process's
        ``wait()`` a :class:`SandboxClosedError` caused by it), later calls raise
        :class:`SandboxClosedError`, and the sandbox counts as closed.  Nothing waits for
        the machine: its channels are closed in the background, and its container goes
        with its instance (``close()`` no longer removes it).  Idempotent."""
        if self._channels.closed:
            return
        self._spawn(self._channels.close_aborted(self._channels.abort(exc)))

    async def __aenter__(self) -> Sandbox:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks[task] = None
        task.add_done_callback(self._tasks.__delitem__)   # added once, so removed once
        return task

    # ---- the channels' calls that sessions and processes make (see AgentChannels) ----
    async def _open_shell(self) -> Channel:
        return await self._channels.open_shell()

    async def _release(self, agent: _Agent | None, *, proc: bool = False, ok: bool = True) -> None:
        await self._channels.release(agent, proc=proc, ok=ok)

    async def _call(self, script: bytes, stdin: bytes, timeout: float, cap: int, *,
                    urgent: bool = False) -> tuple[int, bool, bytes, bytes, int, int, float]:
        return await self._channels.call(script, stdin, timeout, cap, urgent=urgent)

    async def _kill_agent(self, pid: int) -> None:
        await self._channels.kill_agent(pid)

    async def _signal_tree(self, shell_pid: int, since_cs: int, tree_sig: int,
                           shell_sig: int | None) -> None:
        await self._channels.signal_tree(shell_pid, since_cs, tree_sig, shell_sig)

    # ---- commands --------------------------------------------------------------
    def _script(self, cmd: str, env: Mapping[str, str] | None, cwd: str | None) -> bytes:
        if not isinstance(cmd, str):
            raise SpecError("command", f"must be a string, got {type(cmd).__name__}")
        workdir = _check_path("cwd" if cwd is not None else "sandbox.workdir",
                              self.spec.workdir if cwd is None else cwd, absolute=True)
        raw_cmd = _check_command(cmd)
        return (f"cd {sh_quote(workdir, 'cwd')} || exit 126; ".encode()
                + _env_prefix(self.spec.env).encode()
                + _env_prefix(frozen_env("env", env)).encode() + raw_cmd + b"\n")

    async def exec(self, cmd: str, *, timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False,
                   on_stdout: Callable[[bytes], object] | None = None,
                   on_stderr: Callable[[bytes], object] | None = None) -> ExecResult:
        """Run a shell command (``/bin/sh``) in a fresh session.

        A command past its timeout is killed with its whole process tree and returns
        ``timed_out=True``; the sandbox stays usable.  ``binary=True`` returns a
        :class:`BinaryExecResult` whose ``stdout_raw``/``stderr_raw`` hold the exact
        bytes.  ``on_stdout``/``on_stderr`` receive the output as it is written (chunks
        of bytes, up to ``output_cap`` per stream; a callback may be a coroutine
        function); the result is the same.  See docs/api.md (`await sb.exec(...)`)."""
        timeout = self.spec.timeout_s if timeout_s is None else timeout_s
        check_number("timeout_s", timeout, lo=0, hi=7 * 86400, lo_open=True)
        check_number("output_cap", output_cap, lo=0, integer=True)
        script = self._script(cmd, env, cwd)
        if on_stdout is not None or on_stderr is not None:
            proc = await self._start_proc(script, timeout, output_cap, binary, cmd)
            pumps = [asyncio.ensure_future(_pump(s, cb)) for s, cb in
                     ((proc.stdout, on_stdout), (proc.stderr, on_stderr)) if cb is not None]
            try:
                res = await proc.wait()
                await asyncio.gather(*pumps)
                return res
            except BaseException:
                for t in pumps:
                    t.cancel()
                if proc.returncode is None:
                    await proc.kill(9)
                raise
        code, to, out, err, osz, esz, dur = await self._call(script, b"", timeout, output_cap)
        return _result(code, to, out, err, osz, esz, dur, binary)

    @overload
    async def start(self) -> Sandbox: ...

    @overload
    async def start(self, cmd: str, *, timeout_s: float | None = None,
                    env: Mapping[str, str] | None = None, cwd: str | None = None,
                    output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False) -> Process: ...

    async def start(self, cmd: str | None = None, *, timeout_s: float | None = None,
                    env: Mapping[str, str] | None = None, cwd: str | None = None,
                    output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False) -> Sandbox | Process:
        """Start ``cmd`` (``/bin/sh``, in a session of its own) and return at once with a
        :class:`Process`: stream its output (``async for chunk in proc.stdout``), feed its
        standard input, signal it, wait for it.  ``timeout_s=None`` (the default) lets it
        run until it ends, is killed, or the sandbox closes.  ``start()`` without a
        command only opens the sandbox's channel (as before)."""
        if cmd is None:
            return await self.open()
        if timeout_s is not None:
            check_number("timeout_s", timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        check_number("output_cap", output_cap, lo=0, integer=True)
        return await self._start_proc(self._script(cmd, env, cwd), timeout_s or 0.0,
                                      output_cap, binary, cmd)

    async def _start_proc(self, script: bytes, timeout: float, cap: int, binary: bool,
                          cmd: str) -> Process:
        await self._channels.ensure_open()
        agent = await self._channels.acquire(proc=True)
        proc = Process(self, agent, next(self._ids), cmd, cap, binary)
        self._procs[proc] = None
        try:
            await proc._launch(script, timeout)
        except BaseException:
            self._procs.pop(proc, None)
            await self._channels.release(agent, proc=True, ok=False)
            raise
        return proc

    def session(self, name: str = "main", *, shell: str | None = None,
                env: Mapping[str, str] | None = None, cwd: str | None = None) -> Session:
        """The shell session ``name`` (made on first use): cwd, variables, functions and
        an activated virtualenv persist between its :meth:`Session.run` calls.  ``shell``
        is a path such as ``/bin/bash``; None takes bash when the image has it, else
        ``/bin/sh``.  Asking again for a name returns the same session."""
        if self._channels.closed:
            raise SandboxClosedError(f"{self.name} is closed")
        if not isinstance(name, str) or not name or not name.isprintable():
            raise SpecError("session.name", f"must be a non-empty printable string, got {name!r}")
        if shell is not None:
            _check_path("session.shell", shell, absolute=True)
        if cwd is not None:
            _check_path("session.cwd", cwd, absolute=True)
        frozen = frozen_env("session.env", env)
        have = self._sessions.get(name)
        if have is not None:
            if (shell, dict(frozen), cwd) != (have.shell_arg, dict(have.env), have.cwd) and \
                    (shell is not None or frozen or cwd is not None):
                raise SpecError("session", f"{name!r} exists with other settings; close it first "
                                           "or choose another name")
            return have
        s = Session(self, name, shell, frozen, cwd)
        self._sessions[name] = s
        return s

    @property
    def sessions(self) -> Mapping[str, Session]:
        return dict(self._sessions)

    async def terminal(self, *, shell: str | None = None, cwd: str | None = None,
                       env: Mapping[str, str] | None = None, prompt: str | None = None) -> Terminal:
        """A shell on a pseudo-terminal of its own, for interactive programs (a REPL, gdb,
        a pager): ``sendline`` what to type, ``expect`` what to wait for (see
        :class:`~flowmesh_sdk.sandbox.terminal.Terminal`).  ``shell``: a path; None takes
        bash where the image has it, else ``/bin/sh``.  ``prompt``: the shell's PS1 (None:
        a unique one).  The caller closes it (the sandbox's close does too)."""
        await self._channels.ensure_open()
        if shell is not None:
            _check_path("terminal.shell", shell, absolute=True)
        if cwd is not None:
            _check_path("terminal.cwd", cwd, absolute=True)
        if prompt is not None and (not isinstance(prompt, str) or not prompt or not prompt.isprintable()):
            raise SpecError("terminal.prompt", f"must be a non-empty printable string, got {prompt!r}")
        frozen = frozen_env("terminal.env", env)
        run = f"exec {sh_quote(shell)}" if shell else 'b=$(command -v bash) && exec "$b" || exec /bin/sh'
        if self.spec.kernel == "gvisor":   # runsc 20221219 cannot give exec a terminal (no --tty)
            # asked first over the agent: what a runsc exec prints just before it exits can be
            # lost (podman attaches its streams late), so the terminal's own exit cannot say it
            if not (await self.exec("command -v script", timeout_s=30)).ok:
                raise SpecError("sandbox.image", f"{self.spec.image} has no util-linux `script`: a terminal "
                                                 "under gVisor is made with it (runsc cannot give exec one)")
            chan = await self.runtime.open_shell(self.container_id, ["script", "-qfc", run, "/dev/null"])
        else:
            chan = await self.runtime.open_tty(self.container_id, ["/bin/sh", "-c", run])
        self._channels.track(chan)
        return await open_terminal(self, chan, cwd=cwd, env=frozen, prompt=prompt)

    # ---- snapshots -------------------------------------------------------------
    async def snapshot(self, registry: str | None = None, *, tls_verify: bool | None = None) -> str:
        """Commit the sandbox's filesystem to an image, push it to ``registry`` (default
        ``RuntimeConfig.snapshot_registry``) and return its reference pinned by digest
        (``HOST/flowmesh/snapshots@sha256:...``), usable as ``SandboxSpec(image=...)`` on
        any instance that can pull from that registry.  Files are in it; processes,
        sessions and memory are not; sparse files stay sparse where the SDK pulls it
        (``remote/sparse.py``).  ``tls_verify`` defaults to False for a loopback
        registry, else True."""
        await self._channels.ensure_open()
        cfg = self.runtime.config
        host = registry or cfg.snapshot_registry
        if not host:
            raise SpecError("snapshot.registry", "no registry: pass snapshot(registry='HOST:PORT') or set "
                                                 "RuntimeConfig(snapshot_registry=...)")
        if registry is not None:
            type(cfg)(snapshot_registry=registry)           # validated like the config's
        if tls_verify is None:
            tls_verify = not is_loopback_host(host)
        tag = f"{self.name}-{next(self._ids)}"
        local = f"localhost/flowmesh/snapshot-work:{tag}"
        remote = f"{host}/{cfg.snapshot_repository}:{tag}"
        # the agents' scratch files stay out of the image (the agents make them again)
        await self.runtime.exec_once(self.container_id, [
            "sh", "-c", 'rm -rf -- "${TMPDIR:-/tmp}"/.flowmesh-* /tmp/.flowmesh-* /.flowmesh-* 2>/dev/null; :'],
            timeout_s=60)
        digest = await self.runtime.commit_and_push(self.container_id, local, remote,
                                                    tls_verify=tls_verify)
        return f"{host}/{cfg.snapshot_repository}@{digest}"

    # ---- files -----------------------------------------------------------------
    async def read_file(self, path: str, *, max_bytes: int = FILE_CAP) -> bytes:
        _check_path("path", path)
        check_number("max_bytes", max_bytes, lo=0, integer=True)
        code, _, out, err, osz, _, _ = await self._call(
            f"cat -- {sh_quote(path, 'path')}\n".encode(), b"", _FILE_TIMEOUT_S, max_bytes)
        if code != 0:
            raise SandboxFileError(f"{self.name}: cannot read {path}: "
                                   f"{err.decode('utf-8', 'replace').strip()}")
        if osz > len(out):
            raise SandboxFileError(f"{self.name}: {path} is {osz} bytes, over max_bytes={max_bytes}")
        return out

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        """Write ``data`` (up to ``FILE_CAP`` bytes; any bytes, NUL included) to ``path``,
        creating parent directories.  The data travels over the channel as the standard
        input of ``cat``, never in an argument."""
        _check_path("path", path)
        if mode is not None:
            check_number("mode", mode, lo=0, hi=0o7777, integer=True)
        raw = data.encode() if isinstance(data, str) else bytes(data)
        if len(raw) > FILE_CAP:
            raise SpecError("data", f"is {len(raw)} bytes, over the {FILE_CAP}-byte write limit")
        q = sh_quote(path, "path")
        parent = sh_quote(posixpath.dirname(path) or "/", "path")
        chmod = f" && chmod {mode:o} -- {q}" if mode is not None else ""
        script = f"cd / || exit 126; mkdir -p -- {parent} && cat > {q}{chmod}\n".encode()
        code, _, _, err, _, _, _ = await self._call(script, raw, _FILE_TIMEOUT_S, 65536)
        if code != 0:
            raise SandboxFileError(f"{self.name}: cannot write {path}: "
                                   f"{err.decode('utf-8', 'replace').strip()}")

    async def upload(self, local_dir: str, remote_dir: str) -> None:
        """Copy a local directory tree into the sandbox at ``remote_dir``."""
        if not os.path.isdir(local_dir):
            raise SpecError("local_dir", f"{local_dir!r} is not a directory")
        _check_path("remote_dir", remote_dir)
        blob = await asyncio.to_thread(_tar_dir, local_dir)
        res = await self.runtime.exec_once(
            self.container_id,
            ["sh", "-c", 'mkdir -p -- "$1" && tar -x -f - -C "$1"', "sh", remote_dir], input=blob)
        if not res.ok:
            raise SandboxFileError(f"{self.name}: upload to {remote_dir} failed: {res.describe()}")

    async def download(self, remote_path: str, local_dir: str) -> None:
        """Copy a file or directory from the sandbox into ``local_dir``."""
        _check_path("remote_path", remote_path)
        if os.path.exists(local_dir) and not os.path.isdir(local_dir):
            raise SpecError("local_dir", f"{local_dir!r} exists and is not a directory")
        parent, base = posixpath.split(remote_path.rstrip("/")) if remote_path != "/" else ("/", ".")
        res = await self.runtime.exec_once(
            self.container_id, ["tar", "-c", "-f", "-", "-C", parent or "/", base])
        if not res.ok:   # tar's first complaint says why ("Cannot stat: No such file..."), its last only that it failed
            first = res.stderr.decode("utf-8", "replace").strip().partition("\n")[0]
            raise SandboxFileError(f"{self.name}: download of {remote_path} failed: {first or res.describe()}")
        try:
            await asyncio.to_thread(_untar, res.stdout, local_dir)
        except (OSError, tarfile.TarError) as exc:   # not writable here, or an entry the data filter refuses
            raise SandboxFileError(f"{self.name}: download of {remote_path} into {local_dir} failed: {exc}") from exc


def _tar_dir(path: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for entry in sorted(os.listdir(path)):
            tar.add(os.path.join(path, entry), arcname=entry)
    return buf.getvalue()


def _untar(blob: bytes, dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(dest, filter="data")
