import asyncio

import pytest

from flowmesh_sdk.control import EventBus, EventKind, InProcessBackend, QuotaLimits
from flowmesh_sdk.control.events import Event
from flowmesh_sdk.control.limits import Quota, Semaphore, TokenBucket
from flowmesh_sdk.errors import QuotaError, SpecError, ThrottledError


def test_token_bucket_burst_then_empty():
    b = TokenBucket(rate=0.001, burst=5, key="ec2:RunInstances")
    assert [b.try_acquire() for _ in range(6)] == [True] * 5 + [False]


async def test_token_bucket_acquire_serves_waiters_in_order():
    b = TokenBucket(rate=200.0, burst=1)
    order: list[int] = []

    async def take(i: int) -> None:
        await b.acquire()
        order.append(i)

    await asyncio.gather(*(take(i) for i in range(5)))
    assert order == [0, 1, 2, 3, 4]


async def test_token_bucket_deadline():
    b = TokenBucket(rate=0.01, burst=1)
    await b.acquire()
    with pytest.raises(ThrottledError, match="next token"):
        await b.acquire(timeout_s=1.0)


def test_limits_validate():
    with pytest.raises(SpecError, match="rate"):
        TokenBucket(rate=0, burst=1, key="k")
    with pytest.raises(SpecError, match="capacity"):
        Semaphore(0)


async def test_semaphore_caps_in_flight_and_is_fifo():
    sem = Semaphore(2)
    running = 0
    peak = 0
    order: list[int] = []

    async def work(i: int) -> None:
        nonlocal running, peak
        await sem.acquire()
        try:
            running += 1
            peak = max(peak, running)
            order.append(i)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        finally:
            running -= 1
            sem.release()

    await asyncio.gather(*(work(i) for i in range(8)))
    assert peak == 2
    assert order == list(range(8))
    assert sem.in_flight == 0


async def test_semaphore_cancelled_waiter_passes_slot_on():
    sem = Semaphore(1)
    await sem.acquire()
    waiter = asyncio.ensure_future(sem.acquire())
    await asyncio.sleep(0)
    assert sem.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    sem.release()
    assert sem.in_flight == 0
    await asyncio.wait_for(sem.acquire(), 1)


def test_quota_rejects_at_submission():
    q = Quota(QuotaLimits(max_in_flight=2))
    q.set("vip", QuotaLimits(max_in_flight=3, max_total=3))
    q.admit("alice")
    q.admit("alice")
    with pytest.raises(QuotaError, match="tenant 'alice' has 2 tasks in flight"):
        q.admit("alice")
    q.release("alice")
    q.admit("alice")
    for _ in range(3):
        q.admit("vip")
    q.release("vip")
    with pytest.raises(QuotaError, match="used its quota of 3"):
        q.admit("vip")


def test_backend_shares_objects_by_key():
    be = InProcessBackend()
    assert be.semaphore("k", 2) is be.semaphore("k", 2)
    assert be.rate_limiter("r", 1, 1) is be.rate_limiter("r", 1, 1)
    assert be.semaphore("k", 4).capacity == 4


async def test_event_bus_subscribers_and_wait_for():
    bus = EventBus()
    seen: list[EventKind] = []
    bus.on(lambda e: seen.append(e.kind), EventKind.TASK_SUCCEEDED)
    bus.on(lambda e: 1 / 0)  # a broken handler does not break publishing
    sub = bus.subscribe(EventKind.INSTANCE_READY)
    bus.publish(Event(EventKind.TASK_SUCCEEDED, fleet="f"))
    bus.publish(Event(EventKind.INSTANCE_READY, fleet="f", instance_id="i-1"))
    assert seen == [EventKind.TASK_SUCCEEDED]
    ev = await sub.next(1.0)
    assert ev.instance_id == "i-1"
    waiter = asyncio.ensure_future(bus.wait_for(lambda e: e.task_id == "t9", 5.0))
    await asyncio.sleep(0)
    bus.publish(Event(EventKind.TASK_FAILED, fleet="f", task_id="t8"))
    bus.publish(Event(EventKind.TASK_FAILED, fleet="f", task_id="t9"))
    assert (await waiter).task_id == "t9"
    with pytest.raises(asyncio.TimeoutError):
        await bus.wait_for(lambda e: False, 0.05)
