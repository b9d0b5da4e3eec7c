"""Running a batch of tasks through a pool (or an auto pool's router): every task
concurrently, results in input order, a failed task a result rather than an exception.
Imported by :mod:`.base` (``Pool.map``), which re-exports it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from ..errors import SpecError
from ..specs import Task, TaskResult


async def run_tasks(run_task: Callable[[Task], Awaitable[TaskResult]], tasks: Iterable[Task],
                    on_result: Callable[[TaskResult], None] | None = None) -> list[TaskResult]:
    """Every task through ``run_task``, concurrently; results in input order.

    A failed task is a result (its ``error`` says why), never an exception.  The batch is
    checked first: an item that is not a :class:`Task` is a :class:`SpecError` naming its
    index, and nothing runs.  The tasks run as one ``TaskGroup``: if ``on_result`` raises
    (or anything unexpected does), every other task is cancelled -- its sandbox destroyed,
    its slot given back -- and that first exception is raised."""
    items = list(tasks)
    for i, t in enumerate(items):
        if not isinstance(t, Task):
            raise SpecError(f"tasks[{i}]", f"must be a Task, got {type(t).__name__}")
    results: list[TaskResult | None] = [None] * len(items)

    async def one(i: int, task: Task) -> None:
        results[i] = res = await run_task(task)
        if on_result is not None:
            on_result(res)

    try:
        async with asyncio.TaskGroup() as tg:
            for i, t in enumerate(items):
                tg.create_task(one(i, t))
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first
    return [r for r in results if r is not None]
