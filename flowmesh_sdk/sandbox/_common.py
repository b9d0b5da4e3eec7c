"""Helpers shared by the sandbox's exec, session and process paths (and the one record,
:class:`_Agent`, that the sandbox hands a process)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import clock, timers
from ..errors import SpecError
from ..remote.runner import Channel
from ..specs import ExecResult

DEFAULT_OUTPUT_CAP = 1 << 20          # bytes kept per stream per command
COMMAND_CAP = 64 << 20                # the largest command text exec takes
LINE_SCRIPT_MAX = 4096                # scripts up to this size are sent as lines


class _Agent:
    """One held-open channel running ``AGENT`` (``pid`` is the agent's, in the sandbox)."""

    __slots__ = ("chan", "pid")

    def __init__(self, chan: Channel, pid: int) -> None:
        self.chan = chan
        self.pid = pid


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


def _check_command(cmd: object) -> bytes:
    if not isinstance(cmd, str):
        raise SpecError("command", f"must be a string, got {type(cmd).__name__}")
    raw = cmd.encode()
    if b"\x00" in raw:
        raise SpecError("command", "must not contain NUL bytes")
    if len(raw) > COMMAND_CAP:
        raise SpecError("command", f"is {len(raw)} bytes, over the {COMMAND_CAP}-byte limit")
    return raw


def _frame_head(kind: str, ident: int, timeout: str, cap: int, script: bytes,
                stdin_len: int | None) -> bytes:
    """``KIND ID [TIMEOUT] CAP SCRIPT_LEN [STDIN_LEN] SCRIPT_LINES``: a short script
    (text, newline-terminated) is read as lines with the ``read`` builtin (no fork), a
    long one copied with dd (SCRIPT_LINES 0)."""
    short = len(script) <= LINE_SCRIPT_MAX and script.endswith(b"\n")
    lines = script.count(b"\n") if short else 0
    fields = [kind, str(ident)]
    if timeout:
        fields.append(timeout)
    fields += [str(cap), str(len(script))]
    if stdin_len is not None:
        fields.append(str(stdin_len))
    fields.append(str(lines))
    return (" ".join(fields) + "\n").encode()


def _decode(data: bytes, total: int) -> str:
    text = data.decode("utf-8", "replace")
    if total > len(data):
        text += truncation_marker(total, len(data))
    return text


def truncation_marker(total: int, kept: int) -> str:
    return f"\n[flowmesh: output truncated: {total} bytes written, first {kept} kept]\n"


def _result(code: int, to: bool, out: bytes, err: bytes, osz: int, esz: int, dur: float,
            binary: bool) -> ExecResult:
    fields: dict[str, Any] = dict(exit_code=code, stdout=_decode(out, osz), stderr=_decode(err, esz),
                  duration_s=dur, timed_out=to, stdout_truncated=osz > len(out),
                  stderr_truncated=esz > len(err), stdout_bytes=osz, stderr_bytes=esz)
    if binary:
        return BinaryExecResult(**fields, stdout_raw=out, stderr_raw=err)
    return ExecResult(**fields)


async def _read_exactly(chan: Channel, n: int, deadline: float) -> bytes:
    if n == 0:
        return b""
    remaining = deadline - clock.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    async with timers.timeout(remaining):
        return await chan.readexactly(n)


async def _read_line(chan: Channel, deadline: float) -> bytes:
    remaining = deadline - clock.monotonic()
    if remaining <= 0:
        raise asyncio.TimeoutError
    async with timers.timeout(remaining):   # no extra task per line, unlike wait_for
        return await chan.readline()
