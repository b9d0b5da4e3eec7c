"""What the provider conformance suite (``tests/providers/test_conformance.py``) needs of a
provider: an environment, found through the provider's descriptor (``conformance``).

A provider folder holds ``conformance.py`` with an async context manager::

    @contextlib.asynccontextmanager
    async def environment(tmp: Path, fixture: Fixture) -> AsyncIterator[ConformanceEnv]: ...

``tmp`` is a fresh directory of the test's; ``fixture(name)`` hands out the suite's shared
resources by name (pytest's session fixtures: ``moto_ec2``, ``gce_emulator``, ``byo_sshd``
...), so an emulator is started once per session; a provider that needs none starts its
own.  On exit the environment terminates what its provider still has and closes it.

``rebuild`` says how a separate process (the suite's crashed-coordinator check) makes the
same provider: ``("module:function", keyword arguments as JSON values)``; the function
returns the provider (:func:`rebuild`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..descriptor import load_ref
from ..provider import LaunchRequest, Provider
from ..specs import InstanceSpec, Offer

Fixture = Callable[[str], Any]
Exhaustion = Callable[[], contextlib.AbstractContextManager[None]]   # a capacity error provoked while entered


@dataclass
class ConformanceEnv:
    name: str
    provider: Provider
    spec: InstanceSpec
    offer: Offer
    exhaust_capacity: Exhaustion   # the provider's own capacity error on the next launch of `offer`
    # how a separate process rebuilds the same provider
    rebuild: tuple[str, dict[str, Any]]


def rebuild(ref: str, options: dict[str, Any]) -> Provider:
    """The provider ``ConformanceEnv.rebuild`` describes."""
    make = load_ref(ref, "conformance.rebuild")
    provider: Provider = make(**options)
    return provider


def run_aside(coro: Awaitable[Any]) -> Any:
    """Run a coroutine to its end from sync code inside a running test loop (on a thread
    of its own, with a loop of its own)."""
    box: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(asyncio.run(coro))  # type: ignore[arg-type]  # callers pass coroutines; the hint says Awaitable
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
    t = threading.Thread(target=target)
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return box[0]


def exhausting(start: Callable[[], Any], stop: Callable[[], Any]) -> Exhaustion:
    """A capacity exhaustion an emulator provokes: ``start()`` on entry, ``stop()`` on exit."""
    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        start()
        try:
            yield
        finally:
            stop()
    return exhaust


@contextlib.asynccontextmanager
async def cleaned_up(provider: Provider) -> AsyncIterator[Provider]:
    """``provider``, and on exit everything it still lists terminated and the provider closed."""
    try:
        yield provider
    finally:
        await provider.terminate([i.id for i in await provider.list_tagged({})])
        await provider.close()


def filled_by(make_filler: Callable[[], Any], cpus: int = 16) -> Exhaustion:
    """A capacity exhaustion for providers that carve machines (``local``, ``ssh``): another
    coordinator (a second provider object on the same state, made by ``make_filler``)
    holds all ``cpus`` of the machine, so the next launch finds no room."""
    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        filler = make_filler()
        big = InstanceSpec(cpus=cpus, memory_gb=1)
        launched = run_aside(filler.launch(LaunchRequest(
            offer=filler._offer(big), spec=big, count=1, request_id="filler",
            tags={"flowmesh:fleet": "filler"})))
        try:
            yield
        finally:
            run_aside(filler.terminate([i.id for i in launched]))
            run_aside(filler.close())
    return exhaust


__all__ = ["ConformanceEnv", "Exhaustion", "Fixture", "cleaned_up", "exhausting", "filled_by", "rebuild", "run_aside"]
