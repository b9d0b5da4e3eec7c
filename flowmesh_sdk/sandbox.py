"""A sandbox: one container, spoken to over a held-open shell channel.

``podman exec`` costs ~200 ms per call; a round trip over a shell that is already
running inside the container costs well under a millisecond plus the command itself.
So each sandbox holds one ``exec -i CTR /bin/sh`` open and frames commands over it:

* the host sends ``__fm_run ID TIMEOUT CAP CWD 'SCRIPT'`` (the script single-quoted,
  so any byte but NUL passes);
* the agent function runs the script in a new session (``setsid``) with stdout and
  stderr to separate files, under a watchdog that kills the whole process group at the
  deadline and leaves a marker, then answers ``__FM__ ID RC TIMEDOUT OUTBYTES ERRBYTES``
  followed by at most CAP bytes of each stream.

Only POSIX sh, ``setsid`` (optional), ``sleep``, ``wc``, ``cat``, ``head`` and ``rm`` are
needed in the image, so busybox and Debian images both work.  A command costs five forks
in the container (watchdog, its sleep, the command, ``wc``, ``cat``).
"""

from __future__ import annotations

import asyncio
import io
import itertools
import os
import posixpath
import re
import tarfile
from collections.abc import Mapping

from . import clock
from .errors import SandboxClosedError, SandboxFileError, SandboxTimeout, SpecError
from .remote.runner import Channel
from .remote.runtime import ContainerRuntime
from .specs import ExecResult, SandboxSpec, check_number, frozen_env

DEFAULT_OUTPUT_CAP = 1 << 20          # bytes kept per stream per command
FILE_CAP = 256 << 20                  # read_file limit
_INLINE_WRITE_MAX = 1 << 20           # larger (or binary with NUL) writes use a one-off exec
_HOST_GRACE_S = 15.0                  # agent must answer within timeout + grace

_AGENT = r"""
__fm_d="${TMPDIR:-/tmp}/.flowmesh-$$"; mkdir -p "$__fm_d" || exit 97
__fm_ss=; command -v setsid >/dev/null 2>&1 && __fm_ss=setsid
__o="$__fm_d/out"; __e="$__fm_d/err"; __t="$__fm_d/timedout"; __pf="$__fm_d/pid"
__fm_run() {
  ( trap 'kill $__s 2>/dev/null; exit 0' TERM
    sleep "$2" & __s=$!; wait $__s
    : > "$__t"; read __q < "$__pf"; kill -KILL -- -$__q 2>/dev/null || kill -KILL $__q 2>/dev/null ) &
  __w=$!
  ( cd "$4" || exit 126; exec $__fm_ss /bin/sh -c "$5" ) >"$__o" 2>"$__e" </dev/null &
  __p=$!; echo $__p > "$__pf"
  wait $__p; __rc=$?
  kill $__w 2>/dev/null; wait $__w 2>/dev/null
  __to=0; [ -e "$__t" ] && { __to=1; rm -f "$__t"; }
  set -- "$1" "$3" $(wc -c "$__o" "$__e")
  printf '__FM__ %s %s %s %s %s\n' "$1" "$__rc" "$__to" "$3" "$5"
  if [ "$3" -le "$2" ] && [ "$5" -le "$2" ]; then cat "$__o" "$__e"
  else head -c "$2" "$__o"; head -c "$2" "$__e"; fi
}
echo __FM_READY__
"""

_HEADER = re.compile(rb"^__FM__ (\d+) (-?\d+) ([01]) (\d+) (\d+)\n$")


def sh_quote(s: str) -> str:
    return sh_quote_bytes(s.encode()).decode()


def sh_quote_bytes(b: bytes) -> bytes:
    """Single-quote for POSIX sh; every byte but NUL passes through unchanged."""
    if b"\x00" in b:
        raise SpecError("command", "must not contain NUL bytes")
    return b"'" + b.replace(b"'", b"'\\''") + b"'"


def _env_prefix(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={sh_quote(v)}\n" for k, v in env.items())


class Sandbox:
    """An isolated container.  Use ``async with`` or call :meth:`close`.

    Commands run one at a time per sandbox (a lock serialises them); open several
    sandboxes for parallel work.
    """

    def __init__(self, runtime: ContainerRuntime, container_id: str, name: str,
                 spec: SandboxSpec, *, instance_id: str = "", image_id: str = "") -> None:
        self.runtime = runtime
        self.container_id = container_id
        self.name = name
        self.spec = spec
        self.instance_id = instance_id
        self.image_id = image_id
        self._chan: Channel | None = None
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    def __repr__(self) -> str:
        return f"Sandbox({self.name}, image={self.spec.image!r}, instance={self.instance_id})"

    # ---- lifecycle -------------------------------------------------------------
    async def start(self) -> Sandbox:
        """Open the command channel (idempotent)."""
        if self._chan is None or not self._chan.alive:
            chan = await self.runtime.open_shell(self.container_id)
            await chan.write(_AGENT.encode())
            deadline = clock.monotonic() + 30.0
            while True:
                line = await _read_line(chan, deadline)
                if line == b"__FM_READY__\n":
                    break
                if not line:
                    raise SandboxClosedError(f"{self.name}: sandbox shell did not start: "
                                             f"{chan.stderr_tail()}")
            self._chan = chan
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Destroy the container (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._chan is not None:
            await self._chan.close()
        await self.runtime.remove([self.container_id])

    async def __aenter__(self) -> Sandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- commands --------------------------------------------------------------
    async def exec(self, cmd: str, *, timeout_s: float | None = None,
                   env: Mapping[str, str] | None = None, cwd: str | None = None,
                   output_cap: int = DEFAULT_OUTPUT_CAP) -> ExecResult:
        """Run a shell command.  A command past its timeout is killed with its whole
        process tree and returns ``timed_out=True``; the sandbox stays usable."""
        timeout = self.spec.timeout_s if timeout_s is None else timeout_s
        check_number("timeout_s", timeout, lo=0, hi=7 * 86400, lo_open=True)
        check_number("output_cap", output_cap, lo=0, integer=True)
        script = (_env_prefix(self.spec.env) + _env_prefix(frozen_env("env", env)) + cmd).encode()
        code, to, out, err, osz, esz, dur = await self._call(
            script, timeout, output_cap, cwd or self.spec.workdir)
        return ExecResult(exit_code=code, stdout=_decode(out, osz), stderr=_decode(err, esz),
                          duration_s=dur, timed_out=to, stdout_truncated=osz > len(out),
                          stderr_truncated=esz > len(err), stdout_bytes=osz, stderr_bytes=esz)

    async def _call(self, script: bytes, timeout: float, cap: int, cwd: str
                    ) -> tuple[int, bool, bytes, bytes, int, int, float]:
        if self._closed:
            raise SandboxClosedError(f"{self.name} is closed")
        async with self._lock:
            await self.start()
            chan = self._chan
            assert chan is not None
            ident = next(self._ids)
            t0 = clock.monotonic()
            line = (f"__fm_run {ident} {timeout:.3f} {cap} {sh_quote(cwd)} ".encode()
                    + sh_quote_bytes(script) + b"\n")
            try:
                await chan.write(line)
                deadline = t0 + timeout + _HOST_GRACE_S
                while True:
                    raw = await _read_line(chan, deadline)
                    if not raw:
                        raise SandboxClosedError(f"{self.name}: channel closed: {chan.stderr_tail()}")
                    m = _HEADER.match(raw)
                    if m and int(m.group(1)) == ident:
                        break
                rc, to, osz, esz = (int(m.group(2)), m.group(3) == b"1",
                                    int(m.group(4)), int(m.group(5)))
                out = await chan.readexactly(min(osz, cap))
                err = await chan.readexactly(min(esz, cap))
            except asyncio.TimeoutError as exc:
                self._chan = None
                await chan.close()
                await self._kill_all()
                raise SandboxTimeout(f"{self.name}: no answer from the sandbox within "
                                     f"{timeout + _HOST_GRACE_S:.0f} s") from exc
            except BaseException:
                # The channel is in an unknown state: drop it and kill what it ran.
                self._chan = None
                await chan.close()
                await self._kill_all()
                raise
            return rc, to, out, err, osz, esz, clock.monotonic() - t0

    async def _kill_all(self) -> None:
        """Kill every process in the container but PID 1 (used when a channel is lost)."""
        try:
            await self.runtime.exec_once(self.container_id, ["sh", "-c", "kill -9 -1"], timeout_s=30)
        except Exception:  # noqa: BLE001 - best effort; the container is removed on close
            pass

    # ---- files -----------------------------------------------------------------
    async def read_file(self, path: str, *, max_bytes: int = FILE_CAP) -> bytes:
        code, _, out, err, osz, _, _ = await self._call(f"cat -- {sh_quote(path)}".encode(), 300.0,
                                                        max_bytes, "/")
        if code != 0:
            raise SandboxFileError(f"{self.name}: cannot read {path}: "
                                   f"{err.decode('utf-8', 'replace').strip()}")
        if osz > len(out):
            raise SandboxFileError(f"{self.name}: {path} is {osz} bytes, over max_bytes={max_bytes}")
        return out

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        parent = posixpath.dirname(path) or "/"
        chmod = f" && chmod {mode:o} -- {sh_quote(path)}" if mode is not None else ""
        if b"\x00" not in raw and len(raw) <= _INLINE_WRITE_MAX:
            script = (f"mkdir -p -- {sh_quote(parent)} && printf '%s' ".encode() + sh_quote_bytes(raw)
                      + f" > {sh_quote(path)}{chmod}".encode())
            code, _, _, err, _, _, _ = await self._call(script, 300.0, 65536, "/")
        else:
            res = await self.runtime.exec_once(
                self.container_id,
                ["sh", "-c", f'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"{chmod}', "sh", path],
                input=raw)
            code, err = res.exit_code, res.stderr
        if code != 0:
            raise SandboxFileError(f"{self.name}: cannot write {path}: "
                                   f"{err.decode('utf-8', 'replace').strip()}")

    async def upload(self, local_dir: str, remote_dir: str) -> None:
        """Copy a local directory tree into the sandbox at ``remote_dir``."""
        if not os.path.isdir(local_dir):
            raise SpecError("local_dir", f"{local_dir!r} is not a directory")
        blob = await asyncio.to_thread(_tar_dir, local_dir)
        res = await self.runtime.exec_once(
            self.container_id,
            ["sh", "-c", 'mkdir -p -- "$1" && tar -x -f - -C "$1"', "sh", remote_dir], input=blob)
        if not res.ok:
            raise SandboxFileError(f"{self.name}: upload to {remote_dir} failed: {res.describe()}")

    async def download(self, remote_path: str, local_dir: str) -> None:
        """Copy a file or directory from the sandbox into ``local_dir``."""
        parent, base = posixpath.split(remote_path.rstrip("/")) if remote_path != "/" else ("/", ".")
        res = await self.runtime.exec_once(
            self.container_id, ["tar", "-c", "-f", "-", "-C", parent or "/", base])
        if not res.ok:
            raise SandboxFileError(f"{self.name}: download of {remote_path} failed: {res.describe()}")
        await asyncio.to_thread(_untar, res.stdout, local_dir)


def _decode(data: bytes, total: int) -> str:
    text = data.decode("utf-8", "replace")
    if total > len(data):
        text += f"\n[flowmesh: output truncated: {total} bytes written, first {len(data)} kept]\n"
    return text


async def _read_line(chan: Channel, deadline: float) -> bytes:
    remaining = deadline - clock.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    async with asyncio.timeout(remaining):   # no extra task per line, unlike wait_for
        return await chan.readline()


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
