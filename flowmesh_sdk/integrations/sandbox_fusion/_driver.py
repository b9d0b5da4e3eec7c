"""The program ``/run_jupyter`` runs in the sandbox (as text: it runs there, with the
image's ``python3``, not here).

It plays a notebook's kernel without Jupyter (the default image has no Jupyter): the cells
run in order in one namespace, each with its standard output and error captured; a cell
whose last statement is an expression shows its value as a kernel's ``execute_result``
does (``{"text/plain": repr(value)}``); an exception is the cell's ``error``
(``ename``, ``evalue``, ``traceback``, as a kernel reports one) and the next cell still
runs.  A cell past ``cell_timeout`` (0: none) or the whole past ``total_timeout`` stops the
run with status ``TimeLimitExceeded``.  It writes ``{"status", "cells"}`` as JSON to the
path its input names.
"""

from __future__ import annotations

__all__ = ["JUPYTER_DRIVER"]

JUPYTER_DRIVER = r'''
import ast, io, json, os, signal, sys, time, traceback
from contextlib import redirect_stderr, redirect_stdout

cfg = json.load(open(sys.argv[1]))
sys.path.insert(0, os.getcwd())   # the request's files import as a kernel's working directory's do
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
deadline = time.monotonic() + float(cfg["total_timeout"])
cell_timeout = float(cfg["cell_timeout"])
status, cells = "Finished", []


class _CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CellTimeout()


signal.signal(signal.SIGALRM, _alarm)
for i, source in enumerate(cfg["cells"]):
    left = deadline - time.monotonic()
    limit = min(cell_timeout, left) if cell_timeout > 0 else left
    if limit <= 0:
        status = "TimeLimitExceeded"
        break
    out, err, display, error = io.StringIO(), io.StringIO(), [], []
    name = f"<cell {i}>"
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        with redirect_stdout(out), redirect_stderr(err):
            tree = ast.parse(source, name, "exec")
            last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            exec(compile(tree, name, "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), name, "eval"), namespace)
                if value is not None:
                    namespace["_"] = value
                    display.append({"text/plain": repr(value)})
    except _CellTimeout:
        status = "TimeLimitExceeded"
        error.append({"ename": "TimeoutError", "evalue": f"cell {i} ran past its timeout", "traceback": []})
    except BaseException as exc:
        tb = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
        error.append({"ename": type(exc).__name__, "evalue": str(exc), "traceback": tb})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    cells.append({"stdout": out.getvalue(), "stderr": err.getvalue(), "display": display, "error": error})
    if status != "Finished":
        break
with open(cfg["out"], "w") as fh:
    json.dump({"status": status, "cells": cells}, fh)
'''
