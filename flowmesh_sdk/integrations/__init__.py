"""Drop-in backends: a FlowMesh pool behind what agent and RL code already runs.

* :mod:`flowmesh_sdk.integrations.swerex` -- ``FlowMeshDeployment``, a SWE-ReX
  deployment (``AbstractDeployment``) whose runtime (``AbstractRuntime``) runs on a
  pool's sandbox (extra ``[swerex]``);
* :mod:`flowmesh_sdk.integrations.minisweagent` -- ``FlowMeshEnvironment``, a
  mini-swe-agent environment backed by a shell session in a sandbox (extra
  ``[minisweagent]``);
* :mod:`flowmesh_sdk.integrations.trl` -- ``code_reward``, a reward function for TRL's
  ``GRPOTrainer`` that grades each completion in a sandbox, with result reuse (extra
  ``[train]``).

Each is an optional extra: the core never imports this package, and importing one of
the modules without its package raises :class:`~flowmesh_sdk.errors.IntegrationMissingError`
naming the extra to install.  See docs/integrations.md.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import IntegrationMissingError
from ._pools import close_shared_fleets, register_pool, unregister_pool

__all__ = ["close_shared_fleets", "register_pool", "require", "unregister_pool"]


def require(module: str, *, package: str, extra: str) -> ModuleType:
    """Import ``module`` (of the PyPI package ``package``) or raise
    :class:`IntegrationMissingError` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise IntegrationMissingError(
            f"{module!r} is not installed: this integration needs the {package} package; "
            f"install it with: pip install 'flowmesh-sdk[{extra}]'") from exc
