"""A verl tool whose code runs in FlowMesh sandboxes (extra ``[verl]``).

verl builds the tools of its multi-turn rollouts from a tool-config YAML
(``verl.tools.tool_registry.initialize_tools_from_config``); :class:`FlowMeshTool` is
named there like verl's own tools:

    tools:
      - class_name: flowmesh_sdk.integrations.verl.FlowMeshTool
        config:
          type: native
          image: localhost/flowmesh/swe-base:bookworm
          pool: {name: verl-tools, instance: {cpus: 8, memory_gb: 16}, sandboxes_per_instance: 8}
        tool_schema:
          type: function
          function:
            name: code_interpreter
            description: Run Python code and see its output.
            parameters: {type: object, properties: {code: {type: string}}, required: [code]}

A trajectory's ``create`` takes a sandbox of the pool (warm if it has one), ``execute``
runs the model's ``code`` there as a program (saved as ``answer_path``, so the tests can
``import answer``) or its ``command`` in the trajectory's shell session (cwd and variables
persist), ``calc_reward`` writes the task's tests to ``tests_path`` and runs them in the
same sandbox (1.0 when they pass), and ``release`` destroys the sandbox.  ``pool`` is a
registered pool's name or a mapping of ``PoolSpec`` fields (:mod:`._pools`); the tool
reaches it from verl's event loop without blocking it.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from . import require

require("verl.tools.base_tool", package="verl", extra="verl")

from verl.tools.base_tool import BaseTool  # noqa: E402
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse  # noqa: E402

from ..errors import FlowMeshError, SpecError  # noqa: E402
from ..sandbox import Sandbox  # noqa: E402
from ..specs import ExecResult, SandboxSpec, check_number  # noqa: E402
from ._pools import (PoolHandle, SandboxLease, pool_spec_from_config, resolve_pool,  # noqa: E402
                     sandbox_spec_from_config)
from .trl import DEFAULT_ANSWER_PATH, DEFAULT_TESTS_PATH, passed  # noqa: E402

__all__ = ["FlowMeshTool", "FlowMeshToolConfig"]

log = logging.getLogger("flowmesh.integrations.verl")
_RUNNERS = {"python": "python3 -B", "bash": "bash", "sh": "sh"}
_PARAMETERS = ("code", "command")
_DEFAULT_SCHEMA = {"type": "function", "function": {
    "name": "code_interpreter", "description": "Run a program in a sandbox and see its output.",
    "parameters": {"type": "object", "required": ["code"],
                   "properties": {"code": {"type": "string", "description": "The program to run."}}}}}


@dataclass(frozen=True)
class FlowMeshToolConfig:
    """The tool's ``config`` in verl's tool YAML (``type`` is verl's own key)."""

    image: str
    pool: str | Mapping[str, Any]
    sandbox: Mapping[str, Any] = field(default_factory=dict)   # SandboxSpec fields but image
    tenant: str = "default"
    timeout_s: float = 30.0            # one execute
    tests_timeout_s: float = 60.0      # calc_reward's run of the tests
    language: str = "python"           # what a `code` parameter is: python, bash or sh
    parameter: str | None = None       # the schema's parameter holding the code (code or command)
    answer_path: str = DEFAULT_ANSWER_PATH
    tests_path: str = DEFAULT_TESTS_PATH
    tests_command: str | None = None   # default: python3 -B TESTS_PATH
    type: str = "native"

    @classmethod
    def parse(cls, config: Mapping[str, Any]) -> FlowMeshToolConfig:
        if not isinstance(config, Mapping):
            raise SpecError("tool.config", f"must be a mapping, got {type(config).__name__}")
        allowed = cls.__dataclass_fields__
        for key in config:
            if key not in allowed:
                raise SpecError(f"tool.config.{key}", f"is not a FlowMeshTool setting; allowed: {', '.join(allowed)}")
        for key in ("image", "pool"):
            if key not in config:
                raise SpecError(f"tool.config.{key}", "is required")
        return cls(**config)

    def __post_init__(self) -> None:
        if self.language not in _RUNNERS:
            raise SpecError("tool.config.language", f"must be one of {', '.join(_RUNNERS)}; got {self.language!r}")
        check_number("tool.config.timeout_s", self.timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        check_number("tool.config.tests_timeout_s", self.tests_timeout_s, lo=0, hi=7 * 86400, lo_open=True)
        for name in ("answer_path", "tests_path"):
            path = getattr(self, name)
            if not isinstance(path, str) or not path.startswith("/"):
                raise SpecError(f"tool.config.{name}", f"must be an absolute path, got {path!r}")
        if not isinstance(self.pool, str):
            pool_spec_from_config(self.pool, field="tool.config.pool")    # fail at construction, not first use


@dataclass
class _Trajectory:
    lease: SandboxLease
    tests: str | None
    calls: int = 0


class FlowMeshTool(BaseTool):
    """verl's ``BaseTool`` on a FlowMesh pool: one sandbox per tool instance (trajectory)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.settings = FlowMeshToolConfig.parse(config)
        super().__init__(config, tool_schema or self.get_openai_tool_schema())
        props = self.tool_schema.function.parameters.properties
        self.parameter = self.settings.parameter or next((p for p in _PARAMETERS if p in props), None)
        if self.parameter not in props:
            raise SpecError("tool_schema.function.parameters.properties",
                            "must have the parameter the code comes in "
                            f"({self.settings.parameter or ' or '.join(_PARAMETERS)}"
                            f"; or set config.parameter), got {sorted(props)}")
        self.spec: SandboxSpec = sandbox_spec_from_config(self.settings.sandbox, image=self.settings.image,
                                                          field="tool.config.sandbox")
        self._handle: PoolHandle | None = None
        self._live: dict[str, _Trajectory] = {}

    def __repr__(self) -> str:
        return f"FlowMeshTool({self.name}, image={self.spec.image!r}, live={len(self._live)})"

    async def _pool(self) -> PoolHandle:
        if self._handle is None:           # a mapping's fleet starts here, off verl's loop
            self._handle = await asyncio.to_thread(resolve_pool, self.settings.pool, field="tool.config.pool")
        return self._handle

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Take a sandbox for ``instance_id`` (a new id when None).  verl's agent loop passes
        the row's ``tools_kwargs[NAME].create_kwargs`` as ``create_kwargs``: ``tests`` (what
        :meth:`calc_reward` runs) and ``files`` ({absolute path: text}, written first)."""
        opts = kwargs.get("create_kwargs", kwargs) or {}
        iid = instance_id or str(uuid4())
        if iid in self._live:
            raise SpecError("instance_id", f"{iid!r} already has a sandbox: release it first")
        files = opts.get("files") or {}
        if not isinstance(files, Mapping):
            raise SpecError("create_kwargs.files", f"must be a mapping of absolute path to text, got {files!r}")
        handle = await self._pool()
        lease = await handle.open(self.spec, tenant=self.settings.tenant)
        self._live[iid] = _Trajectory(lease, tests=opts.get("tests"))
        try:
            for path, text in files.items():
                await lease.bridge.hop(lease.sandbox.write_file(str(path), text))
        except BaseException:
            await self.release(iid)
            raise
        return iid, ToolResponse()

    def _trajectory(self, instance_id: str) -> _Trajectory:
        traj = self._live.get(instance_id)
        if traj is None:
            raise SpecError("instance_id", f"{instance_id!r} has no sandbox: call create first (or it was released)")
        return traj

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
                      ) -> tuple[ToolResponse, float, dict]:
        """Run the ``code`` (or ``command``) parameter in the trajectory's sandbox; the text
        is its stdout and stderr, with the exit code or the timeout when it did not exit 0."""
        traj = self._trajectory(instance_id)
        source = parameters.get(self.parameter or "")
        if not isinstance(source, str):
            return ToolResponse(text=f"error: the {self.parameter!r} parameter must be a string"), 0.0, {}
        traj.calls += 1
        sb, s = traj.lease.sandbox, self.settings
        try:
            if self.parameter == "command":
                r = await traj.lease.bridge.hop(sb.session("verl").run(source, timeout_s=s.timeout_s))
            else:
                await traj.lease.bridge.hop(sb.write_file(s.answer_path, source))
                r = await traj.lease.bridge.hop(sb.exec(f"{_RUNNERS[s.language]} {s.answer_path}",
                                                        timeout_s=s.timeout_s, cwd=posixpath.dirname(s.answer_path)))
        except SpecError:
            raise
        except FlowMeshError as exc:
            log.warning("%s: execute failed in %s: %s", self.name, sb.name, exc)
            return ToolResponse(text=f"error: the sandbox failed: {exc}"), 0.0, {"infra_failure": 1.0}
        return ToolResponse(text=_render(r, s.timeout_s)), 0.0, _metrics(r)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """Run the tests (``tests=`` here, else the ``create_kwargs`` ones) in the
        trajectory's sandbox: 1.0 when they exit 0, else 0.0 (also on a timeout or an
        infrastructure failure, which is logged)."""
        traj = self._trajectory(instance_id)
        tests = kwargs.get("tests", traj.tests)
        if not isinstance(tests, str):
            raise SpecError("calc_reward.tests", "give the tests as text: tests= here or in create_kwargs")
        sb, s = traj.lease.sandbox, self.settings
        try:
            await traj.lease.bridge.hop(sb.write_file(s.tests_path, tests))
            r = await traj.lease.bridge.hop(sb.exec(s.tests_command or f"python3 -B {s.tests_path}",
                                                    timeout_s=s.tests_timeout_s, cwd=posixpath.dirname(s.tests_path)))
        except SpecError:
            raise
        except FlowMeshError as exc:
            log.warning("%s: reward 0: the tests could not run in %s: %s", self.name, sb.name, exc)
            return 0.0
        return passed(r)

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Destroy the trajectory's sandbox (an unknown or released id is a no-op)."""
        traj = self._live.pop(instance_id, None)
        if traj is not None:
            await traj.lease.close()

    def sandbox(self, instance_id: str) -> Sandbox:
        """The FlowMesh sandbox of a live instance."""
        return self._trajectory(instance_id).lease.sandbox

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        """The YAML's ``tool_schema``; without one, a ``code_interpreter`` taking ``code``."""
        return getattr(self, "tool_schema", None) or OpenAIFunctionToolSchema.model_validate(_DEFAULT_SCHEMA)


def _render(r: ExecResult, timeout_s: float) -> str:
    text = r.stdout + r.stderr
    if r.timed_out:
        return f"{text}\n[timed out after {timeout_s:g} s]".lstrip("\n")
    if r.exit_code != 0:
        return f"{text}\n[exit code {r.exit_code}]".lstrip("\n")
    return text


def _metrics(r: ExecResult) -> dict[str, float]:
    return {"exit_code": float(r.exit_code), "timed_out": float(r.timed_out), "duration_s": r.duration_s}
