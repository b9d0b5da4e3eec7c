"""Retries, client-side rate limits and failover, wrapped around the provider contract
from outside (drivers never retry on their own).

* ``ThrottledError`` and ``ProviderUnavailableError``: exponential backoff with jitter on
  the SAME offer (same request id, so a launch that did go through is not doubled),
  bounded by ``RetryPolicy.attempts``; the server's ``Retry-After`` hint is honoured.
* ``CapacityError``: the next offer (the caller orders them: zone, type, region,
  provider); each failover is logged and published with the reason and the price delta,
  so a dearer fallback is visible.
* ``QuotaError``: that (provider, region) is skipped for the rest of the run.
* ``AuthError``: that provider is skipped for the rest of the run (its error kept), and
  the next provider's offers are tried; an ``AuthError`` is raised only when nothing is
  left.
* ``SpecError``: stop at once.
* :meth:`Provisioner.fill` is the one launch walk down ranked offers and
  :meth:`Provisioner.terminate` the one terminate-until-confirmed, for pools, elastic
  workers and gc alike.
* A token bucket per (provider, region, API), sized from the provider's declared
  ``Capabilities.rates``, keeps the fleet under the published limits in the first place.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .backoff import backoff_delay, retry_async
from .observe import tracing
from .control.backend import ControlBackend
from .control.limits import TokenBucket
from .errors import (AuthError, BudgetExceededError, CapacityError, FlowMeshError, ProviderUnavailableError,
                     QuotaError, SpecError, ThrottledError)
from .provider import TAG_REQUEST, ApiRate, ContainerRequest, Instance, LaunchRequest, Provider, ProviderState
from .specs import InstanceSpec, Offer

log = logging.getLogger("flowmesh.provisioning")
LAUNCH_TICK_S = 10.0   # a rate-limited launch call waits for about this much refill at most
TERMINATE_ATTEMPTS = 5  # terminate + confirming describe, until the provider no longer lists it
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 6
    backoff_s: float = 0.5
    backoff_max_s: float = 20.0


@dataclass(frozen=True, slots=True)
class Failover:
    """One offer given up on, and why (``pool``: the launch's request prefix, the pool's name)."""

    pool: str
    offer: Offer
    reason: str                   # "capacity", "quota", "quota (skipped)", "throttled", "auth", "auth (skipped)",
    #                               "budget"
    error: str
    price_delta: float            # next offer's $/h minus this one's (None-safe: 0 at the end)


@dataclass(frozen=True, slots=True)
class Fill:
    """What :meth:`Provisioner.fill` launched: the units, and the offers it gave up on."""

    units: int
    failovers: tuple[Failover, ...]


@dataclass(frozen=True, slots=True)
class LaunchOutcome:
    instances: tuple[Instance, ...]
    offer: Offer
    failovers: tuple[Failover, ...]


FailoverHook = Callable[[Failover, Offer | None], None]


class Provisioner:
    def __init__(self, control: ControlBackend, policy: RetryPolicy | None = None,
                 on_failover: FailoverHook | None = None) -> None:
        self.control = control
        self.policy = policy or RetryPolicy()
        self.on_failover = on_failover
        #: called before each backoff of a retried provider call: (provider, region, api, error, wait_s)
        self.on_retry: Callable[[str, str, str, BaseException, float], None] | None = None
        self.skipped: set[tuple[str, str]] = set()   # (provider, region) out of quota
        self.auth_failed: dict[str, AuthError] = {}   # provider -> its credential error, skipped for the run

    # ---- rate limits and retries -------------------------------------------------
    def _bucket(self, provider: Provider, region: str, rate: ApiRate) -> TokenBucket:
        return self.control.rate_limiter(f"{provider.name}:{region}:{rate.api}"
                                         + (":instances" if rate.per_instance else ""),
                                         rate.rate_per_s, rate.burst)

    async def _limit(self, provider: Provider, region: str, api: str, instances: int = 1) -> None:
        for rate in provider.capabilities.rates:
            if rate.api != api:
                continue
            bucket = self._bucket(provider, region, rate)
            await bucket.acquire(min(float(instances), bucket.burst) if rate.per_instance else 1.0)

    def launch_sizes(self, provider: Provider, region: str, count: int) -> list[int]:
        """How to split a launch of ``count`` instances into calls: at most ``max_batch``
        each; and where a per-instance bucket limits launches (EC2's RunInstances resource
        bucket), the first call takes what the bucket holds now and the rest go in calls
        of about ``LAUNCH_TICK_S`` seconds of refill, so that instances start as the budget
        allows rather than waiting for a whole batch's worth of tokens."""
        step = max(1, provider.capabilities.max_batch)
        per = [r for r in provider.capabilities.rates if r.api == "launch" and r.per_instance]
        first = tick = step
        if per:
            slowest = min(per, key=lambda r: r.rate_per_s)
            have = min(self._bucket(provider, region, r).available() for r in per)
            first = min(step, max(1, int(have)))
            tick = min(step, max(1, int(slowest.rate_per_s * LAUNCH_TICK_S)))
        sizes = [min(count, first)]
        while sum(sizes) < count:
            sizes.append(min(tick, count - sum(sizes)))
        return sizes

    @tracing.provider_call
    async def call(self, provider: Provider, region: str, api: str, fn: Callable[[], Awaitable[T]],
                   *, instances: int = 1) -> T:
        """``fn`` within the (provider, region, api) bucket, retrying throttling and outages."""
        def before_sleep(attempt: int, exc: BaseException, wait: float) -> None:
            log.warning("%s %s %s: attempt %d failed (%s); backing off %.1f s", provider.name,
                        region, api, attempt, exc, wait)
            if self.on_retry is not None:
                self.on_retry(provider.name, region, api, exc, wait)

        async def once() -> T:
            await self._limit(provider, region, api, instances)
            return await fn()

        p = self.policy
        return await retry_async(once, attempts=p.attempts, base_s=p.backoff_s, cap_s=p.backoff_max_s,
                                 retry_on=(ThrottledError, ProviderUnavailableError),
                                 before_sleep=before_sleep)

    # ---- launch with failover ------------------------------------------------------
    def usable(self, offer: Offer) -> str | None:
        """Why ``offer`` is skipped for the rest of the run (its provider failed
        authentication, or its region ran out of quota), or None."""
        if offer.provider in self.auth_failed:
            return "auth (skipped)"
        if (offer.provider, offer.region) in self.skipped:
            return "quota (skipped)"
        return None

    async def attempt(self, providers: Mapping[str, Provider], offer: Offer, spec: InstanceSpec, count: int,
                      tags: Mapping[str, str], *, request_prefix: str = "fm",
                      container: ContainerRequest | None = None) -> list[Instance]:
        """One launch call for ``count`` (at most ``max_batch``) instances of ``offer``,
        within its rate limits and retried while throttled; raises the classified error.
        An ``AuthError`` marks the provider, a ``QuotaError`` the (provider, region),
        skipped for the rest of the run.  ``container``: what instances that are containers
        run (:attr:`LaunchRequest.container`)."""
        prov = providers[offer.provider]
        request_id = f"{request_prefix}-{secrets.token_hex(8)}"
        req = LaunchRequest(offer=offer, spec=spec, count=min(count, prov.capabilities.max_batch),
                            request_id=request_id, tags={**tags, TAG_REQUEST: request_id}, container=container)
        try:
            return await self.call(prov, offer.region, "launch", lambda: prov.launch(req), instances=req.count)
        except AuthError as exc:
            self.auth_failed[offer.provider] = exc
            raise
        except QuotaError:
            self.skipped.add((offer.provider, offer.region))
            raise

    async def fill(self, offers: Sequence[Offer], want: int, take: Callable[[Offer, int], Awaitable[int]], *,
                   label: str, what: str, units: Callable[[Offer], int] = lambda offer: 1,
                   halve: bool = True) -> Fill:
        """The one launch walk (pools, elastic workers and :meth:`launch` all use it): fill
        ``want`` units (an instance of ``offer`` holds ``units(offer)``) down ``offers``, best
        first -- as many instances of each as it has room for, then the next for the rest, so
        one burst may land on several offers and providers in ranked order.  ``take(offer,
        n)`` launches up to ``n`` instances of ``offer`` (one call, within the budgets its
        caller keeps) and returns the units they hold (0: nothing more may be launched
        there).  A ``CapacityError`` halves ``n`` until a call goes through or ``n`` is 0
        (without ``halve``: moves on, each offer all or nothing);
        budget, auth, quota, throttling that outlasts the retries and an outage move on to
        the next offer; ``SpecError`` stops at once.  Each offer given up on is a failover
        (reason, price delta).  Raises when not one instance launched: the
        ``BudgetExceededError`` when every refusal was the budget's, else :meth:`exhausted`."""
        if not offers:
            raise SpecError("offers", "no offer to launch")
        remaining = want
        failovers: list[Failover] = []
        errors: list[FlowMeshError] = []
        for i, offer in enumerate(offers):
            if remaining <= 0:
                break
            nxt = offers[i + 1] if i + 1 < len(offers) else None
            skipped = self.usable(offer)
            if skipped is not None:
                why = (str(self.auth_failed[offer.provider]) if skipped.startswith("auth")
                       else "region out of quota earlier in this run")
                self.failed_over(failovers, Failover(label, offer, skipped, why, price_delta(offer, nxt)), nxt)
                continue
            per = max(1, units(offer))
            n = -(-remaining // per)
            error: FlowMeshError | None = None
            while remaining > 0 and n >= 1:
                try:
                    got = await take(offer, n)
                except CapacityError as exc:
                    error = exc
                    n = n // 2 if halve else 0   # what fits of this offer
                    continue
                except (BudgetExceededError, AuthError, QuotaError, ThrottledError, ProviderUnavailableError) as exc:
                    error = exc
                    break
                if got <= 0:
                    break
                remaining -= got
                n = min(n, -(-remaining // per))
            if remaining > 0 and error is not None:
                errors.append(error)
                self.failed_over(failovers, Failover(label, offer, reason_of(error), str(error),
                                                     price_delta(offer, nxt)), nxt)
        if remaining == want:
            budget = [e for e in errors if isinstance(e, BudgetExceededError)]
            if budget and len(budget) == len(errors):
                raise budget[0]
            raise self.exhausted(offers, failovers, errors, what)
        return Fill(want - remaining, tuple(failovers))

    async def launch(self, providers: Mapping[str, Provider], offers: Sequence[Offer],
                     spec: InstanceSpec, count: int, tags: Mapping[str, str], *,
                     request_prefix: str = "fm") -> LaunchOutcome:
        """Launch ``count`` instances of ``spec`` of the first offer that can, down ``offers``
        (:meth:`fill`: one unit an instance, each offer all or nothing; offers may belong to
        different providers: failover crosses clouds)."""
        got: list[tuple[Offer, Instance]] = []

        async def take(offer: Offer, n: int) -> int:
            launched = await self.attempt(providers, offer, spec, n, tags, request_prefix=request_prefix)
            got.extend((offer, inst) for inst in launched)
            return len(launched)

        filled = await self.fill(offers, count, take, label=request_prefix, halve=False,
                                 what=f"{count} x {spec.cpus} cpus / {spec.memory_gb:g} GB")
        return LaunchOutcome(tuple(inst for _, inst in got), got[0][0], filled.failovers)

    # ---- terminate until confirmed -------------------------------------------------
    async def terminate(self, provider: Provider, region: str, ids: Sequence[str], *, label: str) -> set[str]:
        """The one terminate (pools, elastic workers and gc all use it): terminate ``ids``
        and confirm by describe, retried (backing off) while any is still listed, at most
        ``TERMINATE_ATTEMPTS`` rounds, within the (provider, ``region``) buckets.  Returns the
        ids still listed at the end: the caller's TERMINATION_FAILED (kept, still accruing
        cost, retried by the reconciler and gc)."""
        left = list(ids)
        for attempt in range(TERMINATE_ATTEMPTS):
            batch = list(left)
            await self.call(provider, region, "terminate", lambda: provider.terminate(batch), instances=len(batch))
            seen = await self.call(provider, region, "describe", lambda: provider.describe(batch))
            left = [i.id for i in seen if i.state is not ProviderState.TERMINATED]
            if not left:
                return set()
            if attempt + 1 < TERMINATE_ATTEMPTS:
                log.info("%s: %s still listed after terminate (attempt %d); retrying", label, left, attempt + 1)
                await asyncio.sleep(backoff_delay(attempt + 1, 0.5, 10.0))
        log.warning("%s: %s still listed after %d terminate calls: TERMINATION_FAILED (the reconciler and gc "
                    "retry)", label, left, TERMINATE_ATTEMPTS)
        return set(left)

    def exhausted(self, offers: Sequence[Offer], failovers: Sequence[Failover], errors: Sequence[FlowMeshError],
                  what: str) -> FlowMeshError:
        """The error for "no offer could launch ``what``": an ``AuthError`` when every
        failure was authentication, a ``QuotaError`` when every one was quota, else a
        ``CapacityError`` listing what was tried (the last error chained)."""
        tried = "; ".join(f"{f.offer.provider}/{f.offer.region}/{f.offer.instance_type}"
                          f"{' spot' if f.offer.spot else ''}: {f.reason}" for f in failovers)
        last = errors[-1] if errors else None
        if errors and all(isinstance(e, AuthError) for e in errors) or (
                not errors and self.auth_failed and all(o.provider in self.auth_failed for o in offers)):
            if len(errors) == 1 and len(self.auth_failed) <= 1:
                return errors[0]
            err: FlowMeshError = AuthError.of_each(self.auth_failed)
        else:
            cls = QuotaError if errors and all(isinstance(e, QuotaError) for e in errors) or not errors \
                else CapacityError
            err = cls(f"no offer could launch {what}; tried {tried}", code="AllOffersFailed")
        err.__cause__ = last or (next(iter(self.auth_failed.values())) if self.auth_failed else None)
        return err

    def failed_over(self, out: list[Failover], f: Failover, nxt: Offer | None) -> None:
        """Record, log and publish (``on_failover``) one offer given up on."""
        out.append(f)
        where = (f"next: {nxt.provider}/{nxt.region}/{nxt.instance_type} at ${nxt.price_per_hour or 0:.4f}/h "
                 f"({f.price_delta:+.4f} $/h)") if nxt else "no offer left"
        log.warning("failover from %s/%s/%s (%s): %s; %s", f.offer.provider, f.offer.region,
                    f.offer.instance_type, f.reason, f.error, where)
        if self.on_failover is not None:
            self.on_failover(f, nxt)


def reason_of(exc: BaseException) -> str:
    """The failover reason of a launch error: budget, auth, quota, capacity or throttled."""
    if isinstance(exc, BudgetExceededError):
        return "budget"
    if isinstance(exc, AuthError):
        return "auth"
    if isinstance(exc, QuotaError):
        return "quota"
    if isinstance(exc, CapacityError):
        return "capacity"
    return "throttled"


def price_delta(offer: Offer, nxt: Offer | None) -> float:
    return ((nxt.price_per_hour or 0.0) - (offer.price_per_hour or 0.0)) if nxt else 0.0
