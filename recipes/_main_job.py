"""The main job (``recipes/local_swe_eval.py``) as a module, for the recipes that run its
batch elsewhere (over SSH, across clouds): it is a script, not a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load_main_job() -> ModuleType:
    name = "flowmesh_local_swe_eval"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "local_swe_eval.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load recipes/local_swe_eval.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod   # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
