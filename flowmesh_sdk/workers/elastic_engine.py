"""How a rented elastic worker joins: its instance is reached, the engine is started as the
instance's own process (:class:`~.elastic_records.ServeCommand`), and its ``/health`` and
``/v1/models`` are waited for while the process lives."""

from __future__ import annotations

import httpx

from .. import clock
from ..remote.runner import Runner
from .elastic_records import ElasticWorker, ServeCommand
from .errors import WorkerStartError
from .health import wait_until_healthy


async def start_engine(engine: ServeCommand, runner: Runner, w: ElasticWorker, http: httpx.AsyncClient,
                       deadline: float) -> tuple[str, float]:
    """Start ``engine`` on ``w``'s instance over ``runner`` and wait until it serves, by
    ``deadline`` (the loop's clock); sets ``w.pid`` as soon as the engine runs (so a failed
    join can stop it) and returns (its base URL, when the instance was reached)."""
    assert w.instance is not None
    inst = w.instance
    await runner.wait_reachable(max(1.0, deadline - clock.monotonic()))
    booted = clock.monotonic()
    base = engine.base_url(inst, runner)
    res = await runner.run(["sh", "-c", engine.shell(inst, runner, w.name)], timeout_s=60)
    if not res.ok or not res.stdout.strip().isdigit():
        raise WorkerStartError(f"worker {w.name}: the engine did not start: {res.describe()}")
    w.pid = int(res.stdout.strip())

    async def dead() -> str | None:
        # the shell's kill: an instance that is a container may have no kill binary (a pod's
        # exec runs argv as it is, with no shell, where SSH runs it through the login shell)
        r = await runner.run(["sh", "-c", f"kill -0 {w.pid}"], timeout_s=30)
        if r.ok:
            return None
        tail = await runner.run(["tail", "-n", "15", engine.log_path.format(name=w.name)], timeout_s=30)
        return f"engine pid {w.pid} exited: {tail.stdout.decode(errors='replace')[-800:]}"

    await wait_until_healthy(http, base, engine.model, timeout_s=max(1.0, deadline - clock.monotonic()), alive=dead,
                             what=f"elastic worker {w.name}")
    return base, booted
