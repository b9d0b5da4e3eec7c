"""A sandbox: one container, spoken to over a held-open shell channel.

``podman exec`` costs ~200 ms per call; a round trip over a shell that is already
running inside the container costs a few milliseconds.  So each sandbox holds one
``exec -i CTR /bin/sh`` open and frames commands over it.  The agent (``_AGENT``) is a
loop of POSIX sh that reads one header line with the ``read`` builtin (which reads its
input a byte at a time, so nothing past the line is consumed), then the payloads
with ``dd``:

* the host sends ``__fm_run ID TIMEOUT CAP SCRIPT_LEN STDIN_LEN SCRIPT_LINES`` and a
  newline, then exactly SCRIPT_LEN bytes of script and STDIN_LEN bytes of standard input.
  A short script (SCRIPT_LINES > 0) is read line by line with ``read -r`` (no fork); a
  long one is copied with ``dd``.  No payload ever
  travels in an argv string, so any size works (argv strings stop at 128 KiB);
* the agent stores the payloads in files of its own (in 1 MiB ``dd`` chunks, so a full
  disk costs that command, never the framing: what could not be stored is drained),
  creates a fresh pair of output files for this command only (a command's files are
  removed in batches of 32, off the round trip) and holds them open
  (``/proc/self/fd``), so a background job of an earlier command, or a command that
  deletes the agent's files, can reach neither this command's output nor the
  protocol;
* it runs the script in a new session (``setsid``) under a watchdog which at the
  deadline SIGKILLs the session's process group and then every process whose session
  (or parent chain) leads back to the command, found through ``/proc``: this works
  under dash, busybox ash and bash alike;
* it answers ``__FM__ ID RC TIMEDOUT OUTBYTES ERRBYTES`` followed by at most CAP bytes
  of each stream (``RC`` 125 with a message on stderr when the agent itself could not
  run the command, e.g. the disk is full).

Only POSIX sh, ``setsid`` (optional: without it a timeout kills the command's process
tree by parent links), ``dd``, ``sleep``, ``wc``, ``head``, ``mkdir`` and ``rm`` are
needed in the image, so busybox and Debian images both work.
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
from dataclasses import dataclass

from . import clock
from .errors import SandboxClosedError, SandboxFileError, SandboxTimeout, SpecError
from .remote.runner import Channel
from .remote.runtime import ContainerRuntime
from .specs import ExecResult, SandboxSpec, check_number, frozen_env

DEFAULT_OUTPUT_CAP = 1 << 20          # bytes kept per stream per command
FILE_CAP = 256 << 20                  # read_file limit, and write_file's
COMMAND_CAP = 64 << 20                # the largest command text exec takes
_HOST_GRACE_S = 15.0                  # agent must answer within timeout + grace
_FILE_TIMEOUT_S = 300.0
_LINE_SCRIPT_MAX = 4096               # scripts up to this size are sent as lines
AGENT_FAILED = 125                    # exit code when the agent could not run a command

_AGENT = r"""
__fm_ss=; __fm_n=0; command -v setsid >/dev/null 2>&1 && __fm_ss=setsid
__fm_d0="${TMPDIR:-/tmp}/.flowmesh-$$"; __fm_d="$__fm_d0"
__fm_mk() {
  [ -d "$__fm_d" ] && return 0
  for __fm_d in "$__fm_d0" "/tmp/.flowmesh-$$" "/dev/shm/.flowmesh-$$" "/.flowmesh-$$"; do
    mkdir -p "$__fm_d" 2>/dev/null && return 0
  done; return 1
}
__fm_get() {
  __n=$1; __ok=0
  { command exec 8>"$2"; } 2>/dev/null || __ok=1
  while [ "$__n" -gt 0 ]; do
    __k=$__n; [ "$__k" -gt 1048576 ] && __k=1048576
    if [ $__ok = 0 ]; then
      dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >&8 || __ok=1
    else
      dd bs="$__k" count=1 iflag=fullblock 2>/dev/null >/dev/null
    fi
    __n=$((__n - __k))
  done
  exec 8>&-
  return $__ok
}
__fm_lines() {
  __n=$1; __ok=0
  { command exec 8>"$2"; } 2>/dev/null || __ok=1
  while [ "$__n" -gt 0 ]; do
    IFS= read -r __l
    [ $__ok = 0 ] && { printf '%s\n' "$__l" >&8 || __ok=1; } 2>/dev/null
    __n=$((__n - 1))
  done
  exec 8>&-
  return $__ok
}
__fm_kill() {
  __t=" $1 "; __r=0; kill -9 "$1" 2>/dev/null
  while [ $__r -lt 30 ]; do
    __r=$((__r + 1)); __hit=0
    [ -n "$__fm_ss" ] && kill -9 -"$1" 2>/dev/null
    for __f in /proc/[0-9]*/stat; do
      { read -r __l < "$__f"; } 2>/dev/null || continue
      __p=${__f#/proc/}; __p=${__p%/stat}; __l=${__l##*) }
      set -- "$1" $__l
      [ "$2" = Z ] && continue
      if { [ -n "$__fm_ss" ] && [ "$5" = "$1" ]; } || case "$__t" in *" $3 "*) true;; *) false;; esac
      then kill -9 "$__p" 2>/dev/null; __t="$__t$__p "; __hit=1; fi
    done
    [ $__hit = 0 ] && [ $__r -gt 1 ] && break
  done
}
__fm_fail() {
  printf '__FM__ %s %s 0 0 %s
%s' "$__id" 125 "${#1}" "$1"
}
__fm_one() {
  __fm_mk
  __fm_n=$((__fm_n + 1))
  [ $__fm_n -ge 32 ] && { __fm_n=0; rm -f -- "$__fm_d"/*; }
  __s="$__fm_d/$__id.sh"; __i="$__fm_d/$__id.in"; __o="$__fm_d/$__id.out"; __e="$__fm_d/$__id.err"
  __bad=
  if [ "$__sn" -gt 0 ]; then __fm_lines "$__sn" "$__s"; else __fm_get "$__sl" "$__s"; fi || __bad="flowmesh: cannot store the command in $__fm_d (disk full or not writable)"
  if [ "$__il" -gt 0 ]; then
    __fm_get "$__il" "$__i" || __bad="flowmesh: cannot store the input in $__fm_d (disk full or not writable)"
  else __i=/dev/null; fi
  if [ -z "$__bad" ]; then
    { command exec 3>"$__o" 4>"$__e" 5<"$__o" 6<"$__e"; } 2>/dev/null \
      || __bad="flowmesh: cannot create output files in $__fm_d"
  fi
  if [ -n "$__bad" ]; then
    exec 3>&- 4>&- 5<&- 6<&-; __fm_fail "$__bad"; rm -f -- "$__fm_d"/* 2>/dev/null; return
  fi
  $__fm_ss /bin/sh "$__s" <"$__i" >&3 2>&4 3>&- 4>&- 5<&- 6<&- &
  __c=$!
  exec 3>&- 4>&-
  ( trap 'kill $__z 2>/dev/null; exit 0' TERM
    sleep "$__to" & __z=$!; wait $__z
    trap '' TERM; __fm_kill "$__c"; exit 3 ) 5<&- 6<&- &
  __w=$!
  wait $__c; __rc=$?
  kill $__w 2>/dev/null; wait $__w; __tw=$?
  [ "$__tw" = 3 ] && __tw=1 || __tw=0
  set -- $(wc -c /proc/self/fd/5 /proc/self/fd/6 2>/dev/null)
  __os=${1:-0}; __es=${3:-0}; __no=$__os; __ne=$__es
  [ "$__no" -gt "$__cap" ] && __no=$__cap
  [ "$__ne" -gt "$__cap" ] && __ne=$__cap
  printf '__FM__ %s %s %s %s %s
' "$__id" "$__rc" "$__tw" "$__os" "$__es"
  [ "$__no" -gt 0 ] && head -c "$__no" /proc/self/fd/5
  [ "$__ne" -gt 0 ] && head -c "$__ne" /proc/self/fd/6
  exec 5<&- 6<&-
}
__fm_loop() {
  __fm_mk
  echo __FM_READY__
  while IFS=' ' read -r __k __id __to __cap __sl __il __sn; do
    case "$__k $__id $__cap $__sl $__il $__sn" in
      "__fm_run "*[!0-9\ ]*) continue;;
      "__fm_run "*) __fm_one;;
    esac
  done
}
__fm_loop
"""

_HEADER = re.compile(rb"^__FM__ (\d+) (-?\d+) ([01]) (\d+) (\d+)\n$")


@dataclass(frozen=True, slots=True)
class BinaryExecResult(ExecResult):
    """An :class:`ExecResult` that also carries the exact bytes each stream wrote (up to
    the output cap, without the truncation marker): what ``exec(..., binary=True)``
    returns.  ``stdout``/``stderr`` stay the decoded text, so code written for
    ``ExecResult`` works unchanged."""

    stdout_raw: bytes = b""
    stderr_raw: bytes = b""


def sh_quote(s: str, field: str = "command") -> str:
    return sh_quote_bytes(s.encode(), field).decode()


def sh_quote_bytes(b: bytes, field: str = "command") -> bytes:
    """Single-quote for POSIX sh; every byte but NUL passes through unchanged."""
    if b"\x00" in b:
        raise SpecError(field, "must not contain NUL bytes")
    return b"'" + b.replace(b"'", b"'\\''") + b"'"


def _env_prefix(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={sh_quote(v, 'env')}; " for k, v in env.items())


def _check_path(field: str, path: object, *, absolute: bool = False) -> str:
    if not isinstance(path, str) or not path:
        raise SpecError(field, f"must be a non-empty path string, got {path!r}")
    if "\x00" in path:
        raise SpecError(field, f"must not contain NUL bytes, got {path!r}")
    if absolute and not path.startswith("/"):
        raise SpecError(field, f"must be an absolute path (start with /), got {path!r}")
    return path


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
            # One no-op command warms the agent (its first fork/exec of each tool), so
            # the caller's first exec costs what every later one does.
            try:
                await self._exchange(chan, b":\n", b"", 30.0, 0)
            except asyncio.TimeoutError as exc:
                await chan.close()
                raise SandboxClosedError(f"{self.name}: the sandbox agent did not answer: "
                                         f"{chan.stderr_tail()}") from exc
            except BaseException:
                await chan.close()
                raise
            self._chan = chan
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Destroy the container (idempotent).  Background jobs still running in it end
        with it (SIGKILL, with the container)."""
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
                   output_cap: int = DEFAULT_OUTPUT_CAP, binary: bool = False) -> ExecResult:
        """Run a shell command (``/bin/sh``) in a fresh session.

        A command past its timeout is killed with its whole process tree and returns
        ``timed_out=True``; the sandbox stays usable.  ``binary=True`` returns a
        :class:`BinaryExecResult` whose ``stdout_raw``/``stderr_raw`` hold the exact
        bytes.  See docs/api.md ("Sandbox.exec semantics") for what persists."""
        if not isinstance(cmd, str):
            raise SpecError("command", f"must be a string, got {type(cmd).__name__}")
        timeout = self.spec.timeout_s if timeout_s is None else timeout_s
        check_number("timeout_s", timeout, lo=0, hi=7 * 86400, lo_open=True)
        check_number("output_cap", output_cap, lo=0, integer=True)
        workdir = _check_path("cwd" if cwd is not None else "sandbox.workdir",
                              self.spec.workdir if cwd is None else cwd, absolute=True)
        raw_cmd = cmd.encode()
        if b"\x00" in raw_cmd:
            raise SpecError("command", "must not contain NUL bytes")
        if len(raw_cmd) > COMMAND_CAP:
            raise SpecError("command", f"is {len(raw_cmd)} bytes, over the {COMMAND_CAP}-byte limit")
        script = (f"cd {sh_quote(workdir, 'cwd')} || exit 126; ".encode()
                  + _env_prefix(self.spec.env).encode()
                  + _env_prefix(frozen_env("env", env)).encode() + raw_cmd + b"\n")
        code, to, out, err, osz, esz, dur = await self._call(script, b"", timeout, output_cap)
        fields = dict(exit_code=code, stdout=_decode(out, osz), stderr=_decode(err, esz),
                      duration_s=dur, timed_out=to, stdout_truncated=osz > len(out),
                      stderr_truncated=esz > len(err), stdout_bytes=osz, stderr_bytes=esz)
        if binary:
            return BinaryExecResult(**fields, stdout_raw=out, stderr_raw=err)
        return ExecResult(**fields)

    async def _call(self, script: bytes, stdin: bytes, timeout: float, cap: int
                    ) -> tuple[int, bool, bytes, bytes, int, int, float]:
        if self._closed:
            raise SandboxClosedError(f"{self.name} is closed")
        async with self._lock:
            await self.start()
            chan = self._chan
            assert chan is not None
            try:
                return await self._exchange(chan, script, stdin, timeout, cap)
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

    async def _exchange(self, chan: Channel, script: bytes, stdin: bytes, timeout: float, cap: int
                        ) -> tuple[int, bool, bytes, bytes, int, int, float]:
        """One frame out, one answer back (the caller holds the channel)."""
        ident = next(self._ids)
        t0 = clock.monotonic()
        # A short script (text, newline-terminated) goes as lines the agent reads with
        # the `read` builtin (no fork); a long one as bytes it copies with dd.
        short = len(script) <= _LINE_SCRIPT_MAX and script.endswith(b"\n")
        lines = script.count(b"\n") if short else 0
        head = f"__fm_run {ident} {timeout:.3f} {cap} {len(script)} {len(stdin)} {lines}\n".encode()
        if len(stdin) < (1 << 16):
            await chan.write(head + script + stdin)
        else:   # no copy of a large payload
            await chan.write(head + script)
            await chan.write(stdin)
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
        out = await _read_exactly(chan, min(osz, cap), deadline)
        err = await _read_exactly(chan, min(esz, cap), deadline)
        return rc, to, out, err, osz, esz, clock.monotonic() - t0

    async def _kill_all(self) -> None:
        """Kill every process in the container but PID 1 (used when a channel is lost)."""
        try:
            await self.runtime.exec_once(self.container_id, ["sh", "-c", "kill -9 -1"], timeout_s=30)
        except Exception:  # noqa: BLE001 - best effort; the container is removed on close
            pass

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


async def _read_exactly(chan: Channel, n: int, deadline: float) -> bytes:
    if n == 0:
        return b""
    remaining = deadline - clock.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    async with asyncio.timeout(remaining):
        return await chan.readexactly(n)


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
