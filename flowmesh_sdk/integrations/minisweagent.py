"""A mini-swe-agent environment on a FlowMesh sandbox (extra ``[minisweagent]``).

mini-swe-agent's agents call ``env.execute(action, cwd=...)`` and get back
``{"output", "returncode", "exception_info"}``; they render ``env.get_template_vars()``
into their prompts and save ``env.serialize()`` with the trajectory.
:class:`FlowMeshEnvironment` answers those calls from a shell session in a sandbox of a
FlowMesh pool, so switching from ``DockerEnvironment(image=..., cwd=...)`` is:

    from flowmesh_sdk.integrations.minisweagent import FlowMeshEnvironment
    with pool.sandbox(image=IMAGE) as sb:             # a flowmesh_sdk.sync SyncPool
        env = FlowMeshEnvironment(sandbox=sb, cwd="/work/repo")

(or, in async code, ``async with pool.sandbox(...) as sb`` and run the agent in a worker
thread: ``await asyncio.to_thread(agent.run, task)``; the agent's calls go back to the
loop the sandbox belongs to.)

Every action runs in the session's shell (bash when the image has it), as mini-swe-agent's
own environments run it: by default in a fresh subshell (``stateful=False``: a ``cd`` or
``export`` does not carry over, as its prompts tell the model), stdout and stderr merged,
the ``timeout`` killing the action's whole process tree (``returncode`` -1 and an
``exception_info``, as there).  A first output line ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``
with exit 0 raises mini-swe-agent's ``Submitted`` with the rest as the submission, by
mini-swe-agent's own check.  The template variables carry the config and the *sandbox's*
``uname`` (system, node, release, version, machine).
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
from typing import Any, cast

from . import require

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")   # no banner on import (set it to 0 to see it)
require("minisweagent", package="mini-swe-agent", extra="minisweagent")

from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ..errors import FlowMeshError, SpecError  # noqa: E402
from ..pools.failures import lost_kind  # noqa: E402
from ..sandbox import Sandbox  # noqa: E402
from ..sync import SyncSandbox  # noqa: E402
from ._bridge import LoopBridge  # noqa: E402
from ._shell import cwd_errno  # noqa: E402

__all__ = ["FlowMeshEnvironment", "FlowMeshEnvironmentConfig"]

log = logging.getLogger("flowmesh.integrations.minisweagent")
_UNAME = ("system", "node", "release", "version", "machine")
_CWD_MARK = "__FM_NOCWD__"   # + a nonce and the errno: the action's cwd could not be entered


class FlowMeshEnvironmentConfig(BaseModel):
    cwd: str = "/"
    """Working directory of an action without ``cwd=`` (absolute)."""
    env: dict[str, str] = {}
    """Environment variables of the session's shell."""
    timeout: int = 30
    """Seconds an action may run; past it its processes are killed."""
    session: str = "mini-swe-agent"
    """Name of the sandbox session the actions run in."""
    stateful: bool = False
    """True: actions share one shell (cd, variables, functions persist); False: each runs
    in a fresh subshell of it, as mini-swe-agent's own environments do."""


def _failed(output: str, exception_type: str, message: str, **extra: Any) -> dict[str, Any]:
    """An action that raised, as mini-swe-agent's LocalEnvironment reports it."""
    return {"output": output, "returncode": -1,
            "exception_info": f"An error occurred while executing the command: {message}",
            "extra": {"exception_type": exception_type, "exception": message, **extra}}


class FlowMeshEnvironment:
    """mini-swe-agent's ``Environment`` on ``sandbox``: a :class:`~flowmesh_sdk.sync.SyncSandbox`,
    or a :class:`~flowmesh_sdk.sandbox.Sandbox` (make the environment in async code on the
    sandbox's loop; ``execute`` is then called from another thread)."""

    def __init__(self, *, sandbox: Sandbox | SyncSandbox, config_class: type = FlowMeshEnvironmentConfig,
                 **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        if not self.config.cwd.startswith("/"):
            raise SpecError("environment.cwd", f"must be an absolute path, got {self.config.cwd!r}")
        if isinstance(sandbox, SyncSandbox):
            self.sandbox, self._bridge = sandbox.sandbox, LoopBridge(sandbox._loop.loop)
        elif isinstance(sandbox, Sandbox):
            self.sandbox, self._bridge = sandbox, LoopBridge.current()
        else:
            raise SpecError("environment.sandbox", "must be a flowmesh_sdk Sandbox or SyncSandbox, got "
                                                   f"{type(sandbox).__name__}")
        self.session = self.sandbox.session(self.config.session, env=self.config.env or None)
        self._platform: dict[str, str] | None = None

    def __repr__(self) -> str:
        return f"FlowMeshEnvironment({self.sandbox.name}, cwd={self.config.cwd!r})"

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]`` in the sandbox and return mini-swe-agent's output dict."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd
        timeout = timeout or self.config.timeout
        # a cwd that cannot be entered: its errno after a mark, and the command not run. `return`
        # ends the session's script (sourced), not its shell: a stateful session keeps its state
        nonce = secrets.token_hex(8)
        body = (f"cd -- {shlex.quote(cwd)} 2>/dev/null || {{ {cwd_errno(cwd)}; echo {_CWD_MARK} {nonce} $__fm_e; "
                f"return 1 2>/dev/null || exit 1; }}\n{command}")
        script = f"{{\n{body}\n}} 2>&1" if self.config.stateful else f"(\n{body}\n) 2>&1"
        try:
            r = self._bridge.call(self.session.run(script, timeout_s=timeout))
        except SpecError:
            raise                     # misuse (called on the loop's thread, a NUL in the command)
        except FlowMeshError as exc:
            log.warning("%s: action failed in the sandbox: %s", self.sandbox.name, exc)
            kind = lost_kind(exc)
            output = _failed("", type(exc).__name__, str(exc), infra_failure=kind.value if kind else None)
        else:
            text = r.stdout + r.stderr
            err = text.removeprefix(f"{_CWD_MARK} {nonce} ").strip()
            if r.exit_code == 1 and err != text.strip() and err.isdigit():
                error = OSError(int(err), os.strerror(int(err)), cwd)   # what LocalEnvironment's subprocess.run raises
                output = _failed("", type(error).__name__, str(error))
            elif r.timed_out:
                output = _failed(text, "TimeoutExpired", f"Command {command!r} timed out after {timeout} seconds")
            else:
                output = {"output": text, "returncode": r.exit_code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        """mini-swe-agent's own completion check: ``Submitted`` on the magic first line."""
        LocalEnvironment._check_finished(cast(Any, self), output)

    def platform(self) -> dict[str, str]:
        """The sandbox's ``uname`` as ``platform.uname()._asdict()`` names it (asked once)."""
        if self._platform is None:
            r = self._bridge.call(self.sandbox.exec("uname -s; uname -n; uname -r; uname -v; uname -m",
                                                    timeout_s=30))
            lines = r.stdout.splitlines() if r.ok else []
            self._platform = dict(zip(_UNAME, lines)) if len(lines) == len(_UNAME) else dict.fromkeys(_UNAME, "")
        return self._platform

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), self.platform(), kwargs)

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json"),
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
            "sandbox": {"name": self.sandbox.name, "image": self.sandbox.spec.image,
                        "image_digest": self.sandbox.image_id, "instance": self.sandbox.instance_id},
        }}}

    def close(self) -> None:
        """End the session's shell (the sandbox is its pool's to destroy)."""
        self._bridge.call(self.session.close())

