"""One request in one fresh sandbox of the pool: write its files and code, compile, run,
read back what it asked for, and say how it went in SandboxFusion's terms.

What the server does with a request follows SandboxFusion's runners
(bytedance/SandboxFusion ``sandbox/runners/base.py``: ``run_commands``, ``restore_files``;
``sandbox/server/sandbox_api.py``: ``parse_run_status``): files are base64, relative to the
request's directory (``null`` contents skipped); the run starts only after a compile that
exited 0; a command past its timeout is ``TimeLimitExceeded`` with no return code; fetched
files that do not exist are left out; any timeout or non-zero return code makes the request
``Failed``.  FlowMesh errors propagate to the server, which answers ``SandboxError``.
"""

from __future__ import annotations

import base64
import binascii
import json
import posixpath
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...errors import SandboxFileError, SpecError
from ...sandbox import Sandbox
from ...specs import MIN_SANDBOX_MEMORY_GB, ExecResult, SandboxSpec
from ._driver import JUPYTER_DRIVER
from .languages import WORKDIR, LanguageSpec
from .models import (CellRunResult, CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse,
                     RunJupyterRequest, RunJupyterResponse, RunStatus)

__all__ = ["decode_files", "execute_code", "execute_jupyter", "sandbox_spec"]

_STDIN = "/tmp/_flowmesh_stdin"
_DRIVER = "/tmp/_flowmesh_jupyter.py"
_DRIVER_IN = "/tmp/_flowmesh_jupyter_in.json"
_DRIVER_OUT = "/tmp/_flowmesh_jupyter_out.json"
_DRIVER_GRACE_S = 10.0   # the driver's own deadline is total_timeout; killed this much later


def decode_files(files: Mapping[str, str | None], where: str) -> dict[str, bytes]:
    """The request's ``files`` decoded (``null`` and SandboxFusion's ``IGNORE_THIS_FILE``
    names skipped), checked before the request takes a slot."""
    out: dict[str, bytes] = {}
    for name, content in files.items():
        if content is None or "IGNORE_THIS_FILE" in name:
            continue
        if not name or "\x00" in name:
            raise SpecError(f"{where}.files", f"a file name must be a non-empty path, got {name!r}")
        try:
            out[name] = base64.b64decode("".join(content.split()), validate=True)   # line breaks allowed
        except (binascii.Error, ValueError) as exc:
            raise SpecError(f"{where}.files[{name!r}]", f"must be base64 text: {exc}") from None
    return out


def sandbox_spec(pool: Any, image: str, memory_limit_mb: int) -> SandboxSpec:
    """The pool's default sandbox for ``image``, its memory cut to ``memory_limit_mb`` when
    that is given (> 0) and smaller than a slot's.  Its commands run in :data:`WORKDIR`,
    which the first file written makes (an image need not have it)."""
    base: SandboxSpec = pool.default_sandbox(image)
    memory = base.memory_gb
    if memory_limit_mb > 0:
        memory = max(MIN_SANDBOX_MEMORY_GB, min(memory, memory_limit_mb / 1024))
    return replace(base, memory_gb=memory)


def _path(name: str) -> str:
    return posixpath.join(WORKDIR, name)   # an absolute name stays itself, as in SandboxFusion


def _command_result(res: ExecResult) -> CommandRunResult:
    if res.timed_out:
        return CommandRunResult(CommandRunStatus.TimeLimitExceeded, execution_time=res.duration_s,
                                stdout=res.stdout, stderr=res.stderr)
    return CommandRunResult(CommandRunStatus.Finished, execution_time=res.duration_s, return_code=res.exit_code,
                            stdout=res.stdout, stderr=res.stderr)


async def _write_files(sb: Sandbox, files: Mapping[str, bytes]) -> None:
    for name, data in files.items():
        await sb.write_file(_path(name), data)


async def _fetch(sb: Sandbox, names: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in names:
        try:
            data = await sb.read_file(_path(name))
        except SandboxFileError:
            continue   # absent (or a directory): left out, as SandboxFusion does
        out[name] = base64.b64encode(data).decode("ascii")
    return out


def run_status(*results: CommandRunResult | None) -> RunStatus:
    """SandboxFusion's verdict over a request's commands."""
    done = [r for r in results if r is not None]
    if any(r.status is CommandRunStatus.Error for r in done):
        return RunStatus.SandboxError
    if any(r.status is CommandRunStatus.TimeLimitExceeded or r.return_code != 0 for r in done):
        return RunStatus.Failed
    return RunStatus.Success


async def execute_code(sb: Sandbox, lang: LanguageSpec, req: RunCodeRequest,
                       files: Mapping[str, bytes]) -> RunCodeResponse:
    """``req`` in the fresh sandbox ``sb`` (``files`` are its decoded ``files``)."""
    await sb.write_file(_path(lang.source), req.code)   # first: it makes the directory
    await _write_files(sb, files)
    compiled: CommandRunResult | None = None
    ran: CommandRunResult | None = None
    if lang.compile is not None:
        compiled = _command_result(await sb.exec(f"{lang.command(lang.compile, req.args)} < /dev/null",
                                                 timeout_s=req.compile_timeout, cwd=WORKDIR))
    if compiled is None or (compiled.status is CommandRunStatus.Finished and compiled.return_code == 0):
        stdin = "/dev/null"
        if req.stdin is not None:
            await sb.write_file(_STDIN, req.stdin)
            stdin = _STDIN
        ran = _command_result(await sb.exec(f"{lang.command(lang.run, req.args)} < {stdin}",
                                            timeout_s=req.run_timeout, cwd=WORKDIR))
    fetched = await _fetch(sb, req.fetch_files)
    status = run_status(compiled, ran)
    message = next((r.stderr or "" for r in (compiled, ran) if r and r.status is CommandRunStatus.Error), "")
    return RunCodeResponse(status, message, compile_result=compiled, run_result=ran, executor_pod_name=sb.name,
                           files=fetched)


async def execute_jupyter(sb: Sandbox, req: RunJupyterRequest, files: Mapping[str, bytes]) -> RunJupyterResponse:
    """``req``'s cells, in order, in one Python interpreter in ``sb`` (the driver in
    :mod:`._driver`).  As SandboxFusion answers: ``Success`` with the cells when the driver
    ran every cell; ``Failed`` (with the driver's result, no cells) when a cell or the whole
    ran past its timeout or the driver died."""
    await sb.write_file(_DRIVER, JUPYTER_DRIVER)
    await sb.write_file(_DRIVER_IN, json.dumps({"cells": list(req.cells), "cell_timeout": req.cell_timeout,
                                                "total_timeout": req.total_timeout, "out": _DRIVER_OUT}))
    await _write_files(sb, files)
    driver = _command_result(await sb.exec(f"mkdir -p {WORKDIR} && cd {WORKDIR} && python3 {_DRIVER} {_DRIVER_IN}"
                                           " < /dev/null", timeout_s=req.total_timeout + _DRIVER_GRACE_S))
    fetched = await _fetch(sb, req.fetch_files)
    if driver.status is not CommandRunStatus.Finished or driver.return_code != 0:
        return RunJupyterResponse(RunStatus.Failed, driver=driver, executor_pod_name=sb.name)
    try:
        out = json.loads(await sb.read_file(_DRIVER_OUT))
    except (SandboxFileError, ValueError):
        return RunJupyterResponse(RunStatus.Failed, driver=driver, executor_pod_name=sb.name)
    if out.get("status") != CommandRunStatus.Finished.value:
        return RunJupyterResponse(RunStatus.Failed, driver=driver, executor_pod_name=sb.name)
    cells = tuple(CellRunResult(stdout=c["stdout"], stderr=c["stderr"], display=tuple(c["display"]),
                                error=tuple(c["error"])) for c in out["cells"])
    return RunJupyterResponse(RunStatus.Success, driver=driver, cells=cells, executor_pod_name=sb.name,
                              files=fetched)
