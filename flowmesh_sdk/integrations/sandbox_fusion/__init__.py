"""A SandboxFusion-compatible HTTP server on a FlowMesh pool (extra ``[sandbox-fusion]``).

SandboxFusion's API (``POST /run_code``, ``POST /run_jupyter``) is what verl's code rewards
(``verl/utils/reward_score/sandbox_fusion/``) and the ``sandbox-fusion`` client call.  This
server speaks it, each request in a fresh sandbox of a pool -- any search space, persistent
or ephemeral, with budgets, metrics and ``flowmesh top`` -- so such a trainer moves to
FlowMesh by pointing its URL here::

    from flowmesh_sdk.integrations.sandbox_fusion import SandboxFusionServer

    async with SandboxFusionServer(pool) as server:     # or: flowmesh serve sandbox-fusion
        sandbox_fusion.set_endpoint(server.url)

The wire format was checked against (and is tested with) the ``sandbox-fusion`` client
0.3.7 from PyPI (``sandbox_fusion/models.py``, ``client.py``, ``async_client.py``), and read
from the server's source, bytedance/SandboxFusion on GitHub: ``sandbox/server/sandbox_api.py``
(the request and response models, ``parse_run_status``, errors answered as
``SandboxError``), ``sandbox/runners/types.py`` (``CommandRunResult``, ``RunJupyterRequest``,
``CellRunResult``), ``sandbox/runners/base.py`` (``run_commands``, ``restore_files``:
timeouts, files in and out) and ``sandbox/runners/major.py`` (how each language compiles
and runs).  Nothing here is copied from them.

The parts: :mod:`.models` (the wire records), :mod:`.languages` (language -> image and
commands), :mod:`.admission` (slots and the bounded queue), :mod:`.runner` (one request in
one sandbox), :mod:`._driver` (the ``/run_jupyter`` program), :mod:`.server` (the aiohttp
application and :class:`SandboxFusionServer`).  See docs/integrations.md.
"""

from __future__ import annotations

from .. import require

require("aiohttp", package="aiohttp", extra="sandbox-fusion")

from .admission import Admission, AdmissionStats, Admit, pool_slots  # noqa: E402
from .languages import DEFAULT_LANGUAGES, WORKDIR, LanguageSpec, parse_image_overrides, with_images  # noqa: E402
from .models import (SANDBOX_FUSION_LANGUAGES, CellRunResult, CommandRunResult, CommandRunStatus,  # noqa: E402
                     RunCodeRequest, RunCodeResponse, RunJupyterRequest, RunJupyterResponse, RunStatus)
from .server import SandboxFusionServer, ServerConfig  # noqa: E402

__all__ = [
    "DEFAULT_LANGUAGES", "SANDBOX_FUSION_LANGUAGES", "WORKDIR", "Admission", "AdmissionStats", "Admit",
    "CellRunResult", "CommandRunResult", "CommandRunStatus", "LanguageSpec", "RunCodeRequest", "RunCodeResponse",
    "RunJupyterRequest", "RunJupyterResponse", "RunStatus", "SandboxFusionServer", "ServerConfig",
    "parse_image_overrides", "with_images",
]
