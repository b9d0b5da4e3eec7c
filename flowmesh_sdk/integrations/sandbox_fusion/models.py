"""The wire format of SandboxFusion's ``/run_code`` and ``/run_jupyter`` as typed records.

Field names, defaults and enum values are those of the ``sandbox-fusion`` client package
0.3.7 (``sandbox_fusion/models.py``: ``RunCodeRequest``, ``RunCodeResponse``,
``CommandRunResult``, ``RunJupyterRequest``, ``RunJupyterResponse``, ``CellRunResult``) and
of the server (bytedance/SandboxFusion ``sandbox/server/sandbox_api.py`` and
``sandbox/runners/types.py``, which add ``memory_limit_MB`` and ``args`` to the request).
Parsing is strict about types and names the field in error (a :class:`SpecError`); unknown
fields are ignored, as pydantic does.  No pydantic here: the server's base is aiohttp.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import SpecError

__all__ = ["CellRunResult", "CommandRunResult", "CommandRunStatus", "RunCodeRequest", "RunCodeResponse",
           "RunJupyterRequest", "RunJupyterResponse", "RunStatus", "SANDBOX_FUSION_LANGUAGES"]

#: every ``language`` value the client's ``Language`` literal allows (0.3.7); a server that
#: does not run one answers ``SandboxError`` naming the ones it runs
SANDBOX_FUSION_LANGUAGES = (
    "python", "python2", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript", "sql",
    "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest", "junit", "kotlin_script",
    "jest", "verilog", "python_gpu", "lean", "swift", "racket", "gtest", "react")


class CommandRunStatus(str, enum.Enum):
    """How one command (a compile or a run) ended."""

    Finished = "Finished"                    # it exited (any return code)
    Error = "Error"                          # it could not be run
    TimeLimitExceeded = "TimeLimitExceeded"  # killed at its timeout (return_code is None)


class RunStatus(str, enum.Enum):
    """How a whole request ended."""

    Success = "Success"            # every command finished with return code 0
    Failed = "Failed"              # a non-zero return code or a timeout
    SandboxError = "SandboxError"  # the server could not run it (``message`` says why)


@dataclass(frozen=True, slots=True)
class CommandRunResult:
    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "execution_time": self.execution_time,
                "return_code": self.return_code, "stdout": self.stdout, "stderr": self.stderr}


_REQUIRED = object()   # a field without a default


def _field(body: Mapping[str, Any], name: str, kind: str, default: Any, *, where: str) -> Any:
    """``body[name]`` checked against ``kind`` (str, number, int, str?, b64map, strlist)."""
    if name not in body:
        if default is _REQUIRED:
            raise SpecError(f"{where}.{name}", "is required")
        return default
    v = body[name]
    fname = f"{where}.{name}"
    if kind == "str" and isinstance(v, str):
        return v
    if kind == "str?" and (v is None or isinstance(v, str)):
        return v
    if kind == "number" and isinstance(v, (int, float)) and not isinstance(v, bool):
        if not math.isfinite(v):
            raise SpecError(fname, f"must be a finite number, got {v!r}")
        return float(v)
    if kind == "int" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind in ("b64map", "b64map?") and isinstance(v, dict):
        for k, item in v.items():
            if not isinstance(item, str) and not (kind == "b64map?" and item is None):
                raise SpecError(f"{fname}[{k!r}]", "must be base64 text" + (" or null" if kind == "b64map?" else "")
                                + f", got {type(item).__name__}")
        return dict(v)
    if kind == "strlist" and isinstance(v, list):
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise SpecError(f"{fname}[{i}]", f"must be a string, got {type(item).__name__}")
        return tuple(v)
    want = {"str": "a string", "str?": "a string or null", "number": "a number", "int": "an integer",
            "b64map": "an object of path -> base64 text", "b64map?": "an object of path -> base64 text or null",
            "strlist": "a list of strings"}[kind]
    raise SpecError(fname, f"must be {want}, got {type(v).__name__}")


def _body(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise SpecError(where, f"the request body must be a JSON object, got {type(obj).__name__}")
    return obj


@dataclass(frozen=True, slots=True)
class RunCodeRequest:
    """``POST /run_code``: ``code`` in ``language``, compiled (when the language is) under
    ``compile_timeout`` and run under ``run_timeout`` with ``stdin``; ``files`` (path ->
    base64, ``null`` skipped) are written first, ``fetch_files`` read back after."""

    code: str
    language: str
    compile_timeout: float = 10.0
    run_timeout: float = 10.0
    memory_limit_MB: int = -1
    stdin: str | None = None
    files: Mapping[str, str | None] = field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()
    args: tuple[str, ...] = ()      # extra arguments (pytest's, as the server takes them)

    @classmethod
    def from_json(cls, obj: Any) -> RunCodeRequest:
        b = _body(obj, "run_code")
        w = "run_code"
        return cls(code=_field(b, "code", "str", _REQUIRED, where=w),
                   language=_field(b, "language", "str", _REQUIRED, where=w),
                   compile_timeout=_field(b, "compile_timeout", "number", 10.0, where=w),
                   run_timeout=_field(b, "run_timeout", "number", 10.0, where=w),
                   memory_limit_MB=_field(b, "memory_limit_MB", "int", -1, where=w),
                   stdin=_field(b, "stdin", "str?", None, where=w),
                   files=_field(b, "files", "b64map?", {}, where=w),
                   fetch_files=_field(b, "fetch_files", "strlist", (), where=w),
                   args=_field(b, "args", "strlist", (), where=w))


@dataclass(frozen=True, slots=True)
class RunCodeResponse:
    status: RunStatus
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None   # here: the sandbox (container) that ran it
    files: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message,
                "compile_result": self.compile_result.to_json() if self.compile_result else None,
                "run_result": self.run_result.to_json() if self.run_result else None,
                "executor_pod_name": self.executor_pod_name, "files": dict(self.files)}


@dataclass(frozen=True, slots=True)
class RunJupyterRequest:
    """``POST /run_jupyter``: ``cells`` run in order in one Python interpreter, each under
    ``cell_timeout`` (0: none), all under ``total_timeout``."""

    cells: tuple[str, ...]
    cell_timeout: float = 0.0
    total_timeout: float = 45.0
    kernel: str = "python3"
    memory_limit_MB: int = -1
    files: Mapping[str, str | None] = field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, obj: Any) -> RunJupyterRequest:
        b = _body(obj, "run_jupyter")
        w = "run_jupyter"
        req = cls(cells=_field(b, "cells", "strlist", _REQUIRED, where=w),
                  cell_timeout=_field(b, "cell_timeout", "number", 0.0, where=w),
                  total_timeout=_field(b, "total_timeout", "number", 45.0, where=w),
                  kernel=_field(b, "kernel", "str", "python3", where=w),
                  memory_limit_MB=_field(b, "memory_limit_MB", "int", -1, where=w),
                  files=_field(b, "files", "b64map?", {}, where=w),
                  fetch_files=_field(b, "fetch_files", "strlist", (), where=w))
        if req.kernel != "python3":
            raise SpecError("run_jupyter.kernel", f"must be 'python3' (the only kernel), got {req.kernel!r}")
        return req


@dataclass(frozen=True, slots=True)
class CellRunResult:
    """One cell: its output streams, its values (``display``: MIME type -> text, as a
    kernel's ``execute_result`` data) and its exception (``ename``, ``evalue``, ``traceback``)."""

    stdout: str
    stderr: str
    display: tuple[Mapping[str, Any], ...] = ()
    error: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "display": [dict(d) for d in self.display],
                "error": [dict(e) for e in self.error]}


@dataclass(frozen=True, slots=True)
class RunJupyterResponse:
    status: RunStatus
    message: str = ""
    driver: CommandRunResult | None = None
    cells: tuple[CellRunResult, ...] = ()
    executor_pod_name: str | None = None
    files: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status.value, "message": self.message,
                "driver": self.driver.to_json() if self.driver else None,
                "cells": [c.to_json() for c in self.cells], "executor_pod_name": self.executor_pod_name,
                "files": dict(self.files)}
