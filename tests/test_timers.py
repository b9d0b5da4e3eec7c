"""flowmesh_sdk.timers: the SDK's timeout, asyncio.timeout's semantics on one loop timer.

Each scenario runs on the simulator's virtual-time loop (exact instants) and is checked
against ``asyncio.timeout`` doing the same."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from flowmesh_sdk import timers
from flowmesh_sdk.sim.loop import run

BOTH = pytest.mark.parametrize("timeout", [timers.timeout, asyncio.timeout], ids=["wheel", "asyncio"])


def _wheel() -> timers._Wheel:
    return timers._wheel(asyncio.get_running_loop())


async def _within(timeout: Callable[[float], Any], limit: float, work: float) -> float | None:
    """``work`` seconds of sleep under ``timeout(limit)``: the loop's time when it timed
    out, or None when the work ended first."""
    try:
        async with timeout(limit):
            await asyncio.sleep(work)
    except TimeoutError:
        return asyncio.get_running_loop().time()
    return None


@BOTH
def test_a_block_past_its_deadline_is_cancelled_and_leaves_as_timeout_error(timeout: Callable[[float], Any]) -> None:
    async def main() -> tuple[str, float, bool]:
        loop = asyncio.get_running_loop()
        cm = timeout(2.5)
        try:
            async with cm:
                await asyncio.sleep(10)
        except TimeoutError:
            return "timeout", loop.time(), cm.expired()
        return "ran out", loop.time(), cm.expired()

    assert run(main()) == ("timeout", 2.5, True)


@BOTH
def test_a_block_that_ends_in_time_is_left_alone(timeout: Callable[[float], Any]) -> None:
    async def main() -> tuple[float, bool]:
        cm = timeout(5)
        async with cm:
            await asyncio.sleep(1)
        await asyncio.sleep(10)      # past the deadline: nothing fires
        return asyncio.get_running_loop().time(), cm.expired()

    assert run(main()) == (11.0, False)


def test_the_wheel_forgets_a_block_that_ended_and_keeps_its_slots_bounded() -> None:
    async def main() -> tuple[int, int]:
        for i in range(5000):
            async with timers.timeout(60 + i * 0.01):    # 5,000 distinct slots, all emptied
                await asyncio.sleep(0)
        w = _wheel()
        return len(w.slots), len(w.due)

    slots, due = run(main())
    assert slots == 0
    assert due <= 64 + 1     # compacted as the emptied slots' numbers piled up


@BOTH
def test_an_inner_deadline_fires_without_the_outer_one(timeout: Callable[[float], Any]) -> None:
    async def main() -> list[str]:
        seen = []
        async with timeout(10):
            try:
                async with timeout(1):
                    await asyncio.sleep(5)
            except TimeoutError:
                seen.append(f"inner at {asyncio.get_running_loop().time()}")
            await asyncio.sleep(2)
            seen.append("outer block goes on")
        return seen

    assert run(main()) == ["inner at 1.0", "outer block goes on"]


@BOTH
def test_an_outer_deadline_cancels_through_the_inner_block(timeout: Callable[[float], Any]) -> None:
    async def main() -> list[str]:
        seen = []
        try:
            async with timeout(1):
                try:
                    async with timeout(10):
                        await asyncio.sleep(5)
                except TimeoutError:
                    seen.append("inner wrongly")
                except asyncio.CancelledError:
                    seen.append("inner sees the cancellation")
                    raise
        except TimeoutError:
            seen.append(f"outer at {asyncio.get_running_loop().time()}")
        return seen

    assert run(main()) == ["inner sees the cancellation", "outer at 1.0"]


@BOTH
def test_a_cancellation_from_outside_is_not_turned_into_a_timeout(timeout: Callable[[float], Any]) -> None:
    async def main() -> str:
        async def victim() -> None:
            async with timeout(1):
                await asyncio.sleep(5)

        t = asyncio.ensure_future(victim())
        await asyncio.sleep(1)        # the deadline and the cancel in the same instant
        t.cancel()
        try:
            await t
        except asyncio.CancelledError:
            return "cancelled"
        except TimeoutError:
            return "timeout"
        return "finished"

    assert run(main()) == "cancelled"


@BOTH
def test_a_task_already_being_cancelled_still_gets_its_timeout(timeout: Callable[[float], Any]) -> None:
    """The task's cancellations are counted from the block's start."""
    async def main() -> float | None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass                      # swallowed without uncancel(): cancelling() stays 1
        return await _within(timeout, 1, 5)

    assert run(main()) == 1.0


@BOTH
def test_a_deadline_already_past_fires_at_the_next_turn(timeout: Callable[[float], Any]) -> None:
    assert run(_within(timeout, -1, 3)) == 0.0


def test_a_deadline_fires_at_the_end_of_its_slot_never_before() -> None:
    async def main() -> list[float | None]:
        return list(await asyncio.gather(*(_within(timers.timeout, s, 5) for s in (1.0, 1.0004, 1.3))))

    first, second, third = run(main())
    assert first is not None and second is not None and third is not None
    assert first == 1.0
    assert 1.0004 <= second <= 1.0004 + timers.TICK    # the next slot, not the first one's
    assert third == pytest.approx(1.3)
    assert third >= 1.3


def test_many_blocks_on_many_tasks_each_fire_at_their_own_deadline() -> None:
    async def main() -> list[float | None]:
        # some end in time, some not
        out = await asyncio.gather(*(_within(timers.timeout, i % 7 + 0.5, i % 5 + 1) for i in range(200)))
        assert not _wheel().slots
        return list(out)

    for i, fired in enumerate(run(main())):
        limit, work = i % 7 + 0.5, i % 5 + 1
        assert fired == (limit if limit < work else None), i


def test_on_a_real_loop_too() -> None:
    async def main() -> bool:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            async with timers.timeout(0.05):
                await asyncio.sleep(5)
        except TimeoutError:
            return loop.time() - t0 >= 0.05
        return False

    assert asyncio.run(main())


@BOTH
def test_a_block_that_ends_before_its_past_deadline_fires_is_not_cancelled_later(
        timeout: Callable[[float], Any]) -> None:
    async def main() -> str:
        async with timeout(-1):
            pass                      # left before the loop's next turn
        await asyncio.sleep(1)
        return "not cancelled"

    assert run(main()) == "not cancelled"


@BOTH
def test_no_delay_sets_no_deadline(timeout: Callable[[float | None], Any]) -> None:
    async def main() -> float:
        async with timeout(None):
            await asyncio.sleep(1e6)
        return asyncio.get_running_loop().time()

    assert run(main()) == 1e6


def test_a_closed_loop_is_freed_with_its_wheel() -> None:
    import gc
    import weakref

    async def main() -> tuple[weakref.ref[asyncio.AbstractEventLoop], weakref.ref[timers._Wheel]]:
        async with timers.timeout(5):
            await asyncio.sleep(0)
        return weakref.ref(asyncio.get_running_loop()), weakref.ref(_wheel())

    loop_ref, wheel_ref = asyncio.run(main())
    gc.collect()
    assert loop_ref() is None
    assert wheel_ref() is None


@BOTH
def test_a_deadline_is_entered_once(timeout: Callable[[float], Any]) -> None:
    async def main() -> str:
        cm = timeout(5)
        async with cm:
            pass
        try:
            async with cm:
                pass
        except RuntimeError:
            return "refused"
        return "entered twice"

    assert run(main()) == "refused"
