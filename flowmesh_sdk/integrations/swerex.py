"""A SWE-ReX deployment on a FlowMesh pool (extra ``[swerex]``).

SWE-agent, SWE-smith and other SWE-ReX users run commands through a deployment
(``AbstractDeployment``) and its ``runtime`` (``AbstractRuntime``).  Switch
``DockerDeployment(image=...)`` for :class:`FlowMeshDeployment` ``(pool, image=...)``
and the same calls run in a sandbox of a FlowMesh pool: a warm container in
milliseconds instead of a container start plus a server inside it.

    from flowmesh_sdk.integrations.swerex import FlowMeshDeployment
    deployment = FlowMeshDeployment(pool, image="localhost/flowmesh/swe-base:bookworm")
    await deployment.start()                       # then exactly as with DockerDeployment:
    await deployment.runtime.create_session(CreateBashSessionRequest())
    obs = await deployment.runtime.run_in_session(BashAction(command="cd /work && ls", timeout=30))

:class:`FlowMeshRuntime` takes SWE-ReX's own request models and answers with its response
models and exception classes:

* ``create_session`` starts a shell session of the sandbox (bash when the image has it)
  and sources ``startup_source``; a second session of one name is ``SessionExistsError``.
* ``run_in_session(BashAction)`` runs the command in that session (cd, variables and
  functions persist); ``output`` is stdout and stderr merged in order.  As SWE-ReX does,
  the command is first checked with ``bash -n`` (the session shell's own ``-n``): a syntax
  error is ``BashIncorrectSyntaxError`` with that check's own message, and nothing of the
  command ran; an empty or comment-only command is exit 0 with empty output;
  past ``timeout`` the command's processes are killed and ``CommandTimeoutError`` is
  raised (the session goes on); ``check="raise"`` raises ``NonZeroExitCodeError``,
  ``"silent"`` returns the exit code, ``"ignore"`` returns ``exit_code=None``.
  ``BashInterruptAction`` interrupts the running command as Ctrl-C.
* Interactive programs (``is_interactive_command`` / ``is_interactive_quit``, a REPL,
  gdb, a pager) run on a pseudo-terminal of the session (:meth:`Sandbox.terminal`),
  opened at the session's first such command in the session's cwd and with its
  environment: the command is typed there and its output read until one of ``expect``
  or the prompt (SWE-ReX's ``SHELLPS1PREFIX``) shows; ``expect_string`` names which.
  Past ``timeout`` it is ``CommandTimeoutError`` and the program keeps running (a
  ``BashInterruptAction`` sends it Ctrl-C).  ``is_interactive_quit`` and a program that
  ends (the prompt shows) close the terminal; the session's other commands run in its
  shell as before.
* ``execute(Command)`` runs an argv list or (``shell=True``) a string like
  ``subprocess.run``: ``env`` replaces the environment, ``cwd``, ``merge_output_streams``,
  ``check`` and ``timeout`` as there, and a program or cwd that cannot be used raises the
  ``OSError`` it raises (``FileNotFoundError``...).  The first runs with ``sandbox.exec`` (a fresh
  ``/bin/sh``); a runtime that executes again keeps a few ``/bin/sh`` sessions and runs
  each command in a subshell of an idle one (a fork instead of a fresh session: about
  half the round trip).
* ``read_file`` / ``write_file`` / ``upload`` go over the sandbox's channel.

When the sandbox is lost (its container or instance gone), every call raises
:class:`SandboxLostError` (a ``SwerexException``, chained to the FlowMesh error) and
``is_alive()`` reports ``False`` with the reason.
"""

from __future__ import annotations

from . import require

require("swerex", package="swe-rex", extra="swerex")

# The runtime (:mod:`._swerex_runtime`), the deployment (:mod:`._swerex_deployment`) and
# the request translation (:mod:`._swerex_scripts`) live beside this module; every public
# name they had here is re-exported.
from ._swerex_deployment import FlowMeshDeployment  # noqa: E402
from ._swerex_runtime import NO_TIMEOUT_S, PS1, FlowMeshRuntime, SandboxLostError  # noqa: E402,F401

__all__ = ["FlowMeshDeployment", "FlowMeshRuntime", "SandboxLostError"]
