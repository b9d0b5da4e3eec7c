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



def test_event_bus_says_which_kinds_anyone_takes():
    # a pool makes no event that nobody takes: the bus must know, as handlers and subscriptions come and go
    bus = EventBus()
    assert not bus.wants(EventKind.SANDBOX_READY)
    bus.on(lambda e: None, EventKind.TASK_STARTED, EventKind.TASK_FAILED)
    assert bus.wants(EventKind.TASK_STARTED) and not bus.wants(EventKind.SANDBOX_READY)
    sub = bus.subscribe(EventKind.SANDBOX_READY)
    assert bus.wants(EventKind.SANDBOX_READY) and not bus.wants(EventKind.IMAGE_PULLED)
    everything = bus.subscribe()
    assert bus.wants(EventKind.IMAGE_PULLED)
    everything.close()
    sub.close()
    assert not bus.wants(EventKind.SANDBOX_READY) and bus.wants(EventKind.TASK_FAILED)

    # a handler that adds another while it is called: the new one hears the next event, not this one
    heard: list[str] = []

    def first(e: Event) -> None:
        heard.append("first")
        if len(heard) == 1:
            bus.on(lambda _: heard.append("late"), EventKind.TASK_STARTED)
    bus.on(first, EventKind.TASK_STARTED)
    bus.publish(Event(EventKind.TASK_STARTED, fleet="f"))
    bus.publish(Event(EventKind.TASK_STARTED, fleet="f"))
    assert heard == ["first", "first", "late"]

def test_spend_ledger_running_sums_match_every_charge_summed(monkeypatch):
    """The ledger's O(1) sums against the definition (each charge: price x max(billing
    minimum, end or now - start)), through launches, terminations, replaced charges and
    minimums running out, for every pool/provider selection."""
    import random

    from flowmesh_sdk import clock
    from flowmesh_sdk.control.spend import Charge, SpendLedger

    now = [1000.0]
    monkeypatch.setattr(clock, "monotonic", lambda: now[0])
    rng = random.Random(7)
    led = SpendLedger()
    pools, provs = ("a", "b"), ("ec2", "gce")
    for step in range(400):
        now[0] += rng.choice((0.0, 1.0, 17.0, 61.0, 600.0))
        r = rng.random()
        live = [c for c in led._charges.values() if c.ended is None]
        if r < 0.5 or not live:
            led.start(f"i{step}", pool=rng.choice(pools), provider=rng.choice(provs),
                      price_per_hour=rng.choice((0.1, 0.34, 2.5)), billing_min_s=rng.choice((0.0, 60.0, 3600.0)))
        elif r < 0.85:
            led.end(rng.choice(live).instance_id)
        else:   # a charge made by another coordinator, mirrored again with its end
            c = rng.choice(live)
            led.put(Charge(c.instance_id, c.pool, c.provider, c.price_per_hour, c.started, c.billing_min_s,
                           now[0] - rng.random()))
        for pool in (None, "a", ("a", "b")):
            for prov in (None, "ec2"):
                got = led.summary(pool=pool, provider=prov)
                sel = [c for c in led._charges.values()
                       if (pool is None or c.pool in ((pool,) if isinstance(pool, str) else pool))
                       and (prov is None or c.provider == prov)]
                assert got.spent == pytest.approx(sum(c.cost(now[0]) for c in sel), rel=1e-9, abs=1e-9)
                assert got.burn_per_hour == pytest.approx(sum(c.price_per_hour for c in sel if c.ended is None),
                                                          abs=1e-9)
                assert got.live == sum(c.ended is None for c in sel)
