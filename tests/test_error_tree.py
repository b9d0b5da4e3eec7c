"""The error tree's promise (issue 12, defect 12): everything the SDK raises on bad input is
a FlowMeshError -- here a SpecError naming the field -- never a bare ValueError, TypeError,
KeyError or AttributeError.  Each entry point below is fed bad input through its public API."""

from __future__ import annotations

import pytest

from flowmesh_sdk import SandboxSpec, SpecError, Task
from flowmesh_sdk.bidder import (Bidder, Demand, Policy, TenantAffinity, centralized, effective_price, estimate,
                                 launch_times, pack, plan, score)
from flowmesh_sdk.bidder.gates import NoFeasibleOffer
from flowmesh_sdk.catalog import Catalog
from flowmesh_sdk.cas.local import LocalDirStore
from flowmesh_sdk.control import QuotaLimits
from flowmesh_sdk.control.limits import Quota, TokenBucket
from flowmesh_sdk.errors import FlowMeshError
from flowmesh_sdk.identity import call_identity, canonical, decode, digest_bytes, h_exec, h_task, task_identity
from flowmesh_sdk.registry.reference import ImageRef
from flowmesh_sdk.reuse import ResultReuse
from flowmesh_sdk.specs import ReuseKind

D1 = "sha256:" + "a" * 64


def _only_flowmesh(fn, *args, **kwargs):
    """Call ``fn``; it must raise, and what it raises must be a FlowMeshError."""
    try:
        fn(*args, **kwargs)
    except FlowMeshError as exc:
        return exc
    except BaseException as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"{getattr(fn, '__qualname__', fn)}{args} raised {type(exc).__name__}: {exc} "
                    "(not a FlowMeshError)")
    pytest.fail(f"{getattr(fn, '__qualname__', fn)}{args} raised nothing")


@pytest.fixture(scope="module")
def rows():
    return Catalog.load(warn=False).rows


# ---- bidder --------------------------------------------------------------------------------

def test_bidder_bad_input_is_a_spec_error(rows):
    cases = [
        (Bidder, (5,), {}),
        (Bidder, (rows,), {"policy": "cost"}),
        (Bidder, (rows,), {"affinities": ["acme"]}),
        (Bidder, ([object()],), {}),
        (Demand, (), {"providers": 5}),
        (Demand, (), {"providers": "aws"}),          # would be split into 'a', 'w', 's'
        (Demand, (), {"regions": [1]}),
        (Demand, (), {"resident": "aws/us-east-1"}),
        (TenantAffinity, ("acme",), {"providers": 7}),
        (Policy.parse, (5,), {}),
        (Policy.preset, (["cost"],), {}),
        (launch_times, (4, (), 0), {}),               # max_batch 0 used to loop forever
        (centralized, (rows, Demand(), "m5.2xlarge", 0), {}),
        (centralized, (rows, "demand", "m5.2xlarge", 4), {}),
        (estimate, (rows, "demand"), {}),
        (score, (rows, "demand", Policy()), {}),
        (score, (rows, Demand(), "cost"), {}),
        (score, (rows, Demand(), Policy()), {"caps": {"x": "many"}}),
        (plan, (rows, Demand(), Policy()), {"caps": 3}),
        (plan, ("rows", Demand(), Policy()), {}),
    ]
    for fn, args, kwargs in cases:
        exc = _only_flowmesh(fn, *args, **kwargs)
        assert isinstance(exc, SpecError), (fn, args, kwargs, exc)
    b = Bidder(rows)
    assert isinstance(_only_flowmesh(b.rank, "not a demand"), SpecError)
    assert isinstance(_only_flowmesh(b.rank, Demand(), limit="all"), SpecError)
    assert isinstance(_only_flowmesh(b.plan, Demand(), caps=[1]), SpecError)


def test_bidder_internal_failures_are_flowmesh_errors(rows):
    import numpy as np
    # caps too small for the demand: pack says so with NoFeasibleOffer, not ValueError
    exc = _only_flowmesh(pack, 10, np.array([2]), np.array([1.0]), np.array([0.1]), np.array([1]))
    assert isinstance(exc, NoFeasibleOffer)
    on_demand_only = next(r for r in rows if r.spot_per_hour is None and r.on_demand_per_hour is not None)
    exc = _only_flowmesh(effective_price, on_demand_only, "spot", 1.0)
    assert isinstance(exc, SpecError) and exc.field == "market"


# ---- limits ------------------------------------------------------------------------------

async def test_limits_bad_input_is_a_spec_error():
    bucket = TokenBucket(rate=1.0, burst=2, key="api")
    with pytest.raises(SpecError) as ei:
        await bucket.acquire(5)            # more than the burst: could never be served
    assert ei.value.field == "rate_limit[api].tokens"
    with pytest.raises(SpecError):
        await bucket.acquire("one")
    assert isinstance(_only_flowmesh(bucket.try_acquire, -1), SpecError)
    assert isinstance(_only_flowmesh(TokenBucket, "fast", 1), SpecError)
    assert isinstance(_only_flowmesh(QuotaLimits, max_in_flight=-1), SpecError)
    assert isinstance(_only_flowmesh(QuotaLimits, max_total="10"), SpecError)
    q = Quota()
    assert isinstance(_only_flowmesh(q.set, "bob", {"max_in_flight": 1}), SpecError)
    assert isinstance(_only_flowmesh(q.set, "", QuotaLimits()), SpecError)
    assert isinstance(_only_flowmesh(Quota, {"max_in_flight": 1}), SpecError)


# ---- the registry reference parser ---------------------------------------------------------

@pytest.mark.parametrize("text", [
    None, 5, "", "a b", "x:latest\n", "a\u00a0b", "a\x7fb", "localhost:99999/x", "a..b/x", "loc\x00al/x", "x:t\u00e9",
    "x@sha256:abc", "UPPER/case", "x:" + "t" * 200,
])
def test_reference_parser_refuses_with_spec_error(text):
    exc = _only_flowmesh(ImageRef.parse, text)
    assert isinstance(exc, SpecError) and exc.field == "image"


def test_reference_pinned_without_digest_is_a_spec_error():
    exc = _only_flowmesh(ImageRef.parse("localhost/x:1").pinned)
    assert isinstance(exc, SpecError)
    good = ImageRef.parse("127.0.0.1:5000/team/app:1.2@sha256:" + "b" * 64)
    assert good.registry == "127.0.0.1:5000" and good.pinned().endswith("b" * 64)


# ---- identity ----------------------------------------------------------------------------

def test_identity_bad_input_is_a_spec_error():
    cases = [
        (decode, (b"\xff",)), (decode, (b"s" + (1).to_bytes(8, "big") + b"\xff",)), (decode, ("text",)),
        (h_task, (D1, {}, 5)), (h_task, (D1, [("a", 1)])), (h_exec, (D1, {}, {1, 2})),
        (call_identity, ("inference", D1, {}, {"prompt": "str"})),
        (call_identity, ("inference", D1, {}, [b"x"])),
        (task_identity, ("task", D1)),
    ]
    for fn, args in cases:
        assert isinstance(_only_flowmesh(fn, *args), SpecError), (fn, args)


# ---- reuse -------------------------------------------------------------------------------

async def test_reuse_bad_input_is_a_spec_error(tmp_path):
    cas = LocalDirStore(tmp_path / "cas")
    with pytest.raises(SpecError):
        ResultReuse("not a store")
    with pytest.raises(SpecError):
        ResultReuse(cas, policy={"cache_failures": True})
    reuse = ResultReuse(cas)
    bad_calls = [
        dict(params=[("temperature", 1.0)]),
        dict(inputs={"prompt": "a str, not bytes"}),
        dict(inputs=[b"x"]),
        dict(tenant=""),
        dict(deterministic="yes"),
    ]
    for kw in bad_calls:
        with pytest.raises(SpecError):
            await reuse.call("f", lambda _i: b"out", image_or_model=D1, **kw)
    with pytest.raises(SpecError):
        await reuse.call("f", "not callable", image_or_model=D1)
    with pytest.raises(SpecError):
        await reuse.run("not a task", object())
    task = Task(name="t", sandbox=SandboxSpec(image="localhost/x@sha256:" + "c" * 64), command="true",
                deterministic=True)
    with pytest.raises(SpecError):
        await reuse.run(task, "not a pool")
    with pytest.raises(SpecError):
        await reuse.run(task, _NeverRuns(), cache_failures="yes")


class _NeverRuns:
    name = "never"

    async def run_task(self, task):  # pragma: no cover - validation comes first
        raise AssertionError("must not run")


async def test_a_stored_record_missing_fields_is_corrupt_not_a_key_error(tmp_path):
    """A record that verifies by its digest but is not a whole result record (written by
    something else) is treated as corrupt and recomputed, never a KeyError out of call()."""
    cas = LocalDirStore(tmp_path / "cas")
    reuse = ResultReuse(cas)
    ident = call_identity("call", D1, {}, {}, "cpu", None)
    record = canonical({"kind": "call"})                # no output
    rdigest = await cas.put(record)
    assert rdigest == digest_bytes(record)
    index = canonical({"v": 1, "h_task": ident.h_task, "h_exec": ident.h_exec, "result": rdigest})
    await cas.create_ref("results/sha256/" + ident.h_task.split(":")[1], index)
    res = await reuse.call("f", lambda _i: b"fresh", image_or_model=D1, deterministic=True)
    assert res.ok and res.output == b"fresh" and res.reuse is ReuseKind.EXECUTED
    assert reuse.counts().corrupt == 1
    again = await reuse.call("f", lambda _i: b"other", image_or_model=D1, deterministic=True)
    assert again.reuse is ReuseKind.HIT and again.output == b"fresh"
