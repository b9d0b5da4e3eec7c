"""The provider conformance suite: every provider must pass it -- each installed provider
whose descriptor names a conformance environment (``local``, ``ssh`` on a loopback sshd,
``ec2`` against moto in server mode with the real boto3, ``gce``, ``azure``, ``alibaba``
and ``vast`` against their emulators with their real clients) and ``acme``, the provider
package defined only in tests/plugins.  A new provider is in it by having a
``conformance.py`` in its folder (see conftest.py).

The contract it checks (flowmesh_sdk/provider.py): capabilities declared as
:class:`Capabilities`, with a :class:`~flowmesh_sdk.tags.TagCodec`; offers are shapes
(``price_per_hour`` None) unless the provider is ``free`` (0.0) or the offer is a
marketplace machine (``offer_id``, its quoted price); SDK tags survive the provider's
codec (launch -> describe / list_tagged); ids are never reused; ``Instance.zone`` and
``Instance.port`` are typed."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk import gc
from flowmesh_sdk.control import InProcessBackend
from flowmesh_sdk.errors import CapacityError, FlowMeshError, ProviderError, SpecError
from flowmesh_sdk.provider import (TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_REQUEST, Capabilities,
                                   LaunchRequest, Provider, ProviderState)
from flowmesh_sdk.provisioning import Provisioner, RetryPolicy
from flowmesh_sdk.tags import TagCodec

HERE = Path(__file__).parent


def _tags(fleet: str) -> dict[str, str]:
    return {TAG_FLEET: fleet, TAG_POOL: "conf", TAG_OWNER: "conformance"}


def _n(env, count: int) -> int:
    """``count``, or fewer where one offer is one machine (a marketplace offer's ``available``)."""
    return count if env.offer.available is None else max(1, min(count, env.offer.available))


def _req(env, count: int, fleet: str, rid: str | None = None) -> LaunchRequest:
    rid = rid or f"conf-{uuid.uuid4().hex[:10]}"
    return LaunchRequest(offer=env.offer, spec=env.spec, count=count, request_id=rid,
                         tags={**_tags(fleet), TAG_REQUEST: rid})


class CountingProvider(Provider):
    """Counts the contract calls made to the provider it wraps (instrumentation, not a fake)."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.capabilities = inner.capabilities
        self.launches: list[int] = []

    async def offers(self, spec):
        return await self.inner.offers(spec)

    async def launch(self, request):
        self.launches.append(request.count)
        return await self.inner.launch(request)

    async def describe(self, ids):
        return await self.inner.describe(ids)

    async def terminate(self, ids):
        return await self.inner.terminate(ids)

    async def list_tagged(self, tags):
        return await self.inner.list_tagged(tags)

    def runner(self, instance):
        return self.inner.runner(instance)


async def test_capabilities_are_declared(env):
    caps = env.provider.capabilities
    assert isinstance(caps, Capabilities) and caps.max_batch >= 1
    assert isinstance(caps.tags, TagCodec)
    assert all(isinstance(getattr(caps, f), bool) for f in ("spot", "gpus", "stop_start", "remote",
                                                             "nested_containers", "free"))
    assert env.provider.name == env.name
    assert env.offer.provider == env.name and env.offer.fits(env.spec)


async def test_offers_are_shapes_unless_free_or_a_marketplace_quote(env):
    caps = env.provider.capabilities
    offers = await env.provider.offers(env.spec)
    assert offers and all(o.provider == env.name and o.fits(env.spec) for o in offers)
    for o in offers:
        if caps.free:
            assert o.price_per_hour == 0.0, o          # the user's own machines cost nothing
        elif o.offer_id is None:
            assert o.price_per_hour is None, o         # priced by the fleet, from the catalog
        else:
            assert isinstance(o.offer_id, str) and o.offer_id
            assert o.price_per_hour is None or o.price_per_hour >= 0
        assert o.reliability is None or 0 < o.reliability <= 1, o
        assert o.available is None or (isinstance(o.available, int) and o.available >= 0), o
        assert o.zone is None or (isinstance(o.zone, str) and o.zone)
    assert caps.spot or not any(o.spot for o in offers)


async def test_sdk_tags_survive_the_providers_codec(env):
    """What the provider encodes with its codec, describe and list_tagged hand back as the
    SDK's tags; a filter with SDK tags finds the instance."""
    codec = env.provider.capabilities.tags
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    tags = {**_tags(fleet), TAG_POOL: "Conf_Pool.A-1", "flowmesh:note": "x y/z:1"}
    assert codec.decode(codec.encode(tags)) == tags     # the codec itself is reversible on these
    rid = f"codec-{uuid.uuid4().hex[:8]}"
    (inst,) = await env.provider.launch(LaunchRequest(offer=env.offer, spec=env.spec, count=1, request_id=rid,
                                                      tags={**tags, TAG_REQUEST: rid}))
    try:
        assert {**tags, TAG_REQUEST: rid}.items() <= inst.tags.items(), inst.tags
        (seen,) = await env.provider.describe([inst.id])
        assert {**tags, TAG_REQUEST: rid}.items() <= seen.tags.items(), seen.tags
        for query in ({TAG_FLEET: fleet}, {TAG_POOL: "Conf_Pool.A-1", TAG_FLEET: fleet}, {TAG_REQUEST: rid}):
            assert [i.id for i in await env.provider.list_tagged(query)] == [inst.id], query
            assert all(i.tags.get(TAG_POOL) == "Conf_Pool.A-1" for i in await env.provider.list_tagged(query))
        assert await env.provider.list_tagged({TAG_FLEET: fleet, TAG_POOL: "conf_pool.a-1"}) == []
        assert inst.id in {i.id for i in await env.provider.list_tagged({})}
    finally:
        await env.provider.terminate([inst.id])


async def test_ids_are_never_reused(env):
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    first = await env.provider.launch(_req(env, 1, fleet))
    await env.provider.terminate([i.id for i in first])
    second = await env.provider.launch(_req(env, 1, fleet))          # a new request id
    try:
        assert not {i.id for i in first} & {i.id for i in second}
        assert [i.id for i in await env.provider.list_tagged({TAG_FLEET: fleet})] == [i.id for i in second]
        gone = [i for i in await env.provider.describe([i.id for i in first])
                if i.state is not ProviderState.TERMINATED]
        assert gone == []                                             # the old id names only the old one
    finally:
        await env.provider.terminate([i.id for i in second])


async def test_instance_zone_and_port_are_typed(env):
    launched = await env.provider.launch(_req(env, 1, f"c-{uuid.uuid4().hex[:6]}"))
    try:
        for inst in launched + await env.provider.describe([i.id for i in launched]):
            assert inst.zone is None or (isinstance(inst.zone, str) and inst.zone), inst
            assert inst.port is None or (isinstance(inst.port, int) and not isinstance(inst.port, bool)
                                         and 1 <= inst.port <= 65535), inst
            assert isinstance(inst.price_per_hour, float) and inst.price_per_hour >= 0
            if env.name == "ssh":
                assert inst.port == env.provider.hosts[inst.address].port and inst.zone is None
            if env.name == "ec2":
                assert inst.zone and inst.zone.startswith(inst.region)   # Placement.AvailabilityZone
            if env.name == "gce":
                assert inst.zone == env.offer.zone and inst.region == inst.zone.rsplit("-", 1)[0]
    finally:
        await env.provider.terminate([i.id for i in launched])


async def test_launch_describe_terminate_round_trip(env):
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    launched = await env.provider.launch(_req(env, _n(env, 2), fleet))
    ids = [i.id for i in launched]
    assert len(set(ids)) == _n(env, 2)
    for inst in launched:
        assert inst.provider == env.name and inst.spec == env.spec
        assert inst.state in (ProviderState.PENDING, ProviderState.RUNNING)
    seen = await env.provider.describe(ids + ["i-0123456789abcdef0", "local-000000000000"])
    assert sorted(i.id for i in seen) == sorted(ids)       # unknown ids are omitted, not errors
    await env.provider.terminate(ids)
    await env.provider.terminate(ids)                     # terminating twice is not an error
    left = [i for i in await env.provider.describe(ids) if i.state is not ProviderState.TERMINATED]
    assert left == []
    assert await env.provider.list_tagged({TAG_FLEET: fleet}) == []


async def test_tags_on_every_instance_and_list_tagged(env):
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    req = _req(env, _n(env, 3), fleet)
    launched = await env.provider.launch(req)
    try:
        for inst in launched:
            for k, v in req.tags.items():
                assert inst.tags.get(k) == v, (k, inst.tags)
        listed = await env.provider.list_tagged({TAG_FLEET: fleet})
        assert sorted(i.id for i in listed) == sorted(i.id for i in launched)
        assert all(i.tags[TAG_POOL] == "conf" for i in listed)
        assert any(i.tags.get(TAG_FLEET) == fleet for i in await env.provider.list_tagged({}))
    finally:
        await env.provider.terminate([i.id for i in launched])


async def test_relaunch_with_the_same_request_id_is_idempotent(env):
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    rid = f"same-{uuid.uuid4().hex[:8]}"
    first = await env.provider.launch(_req(env, _n(env, 2), fleet, rid))
    again = await env.provider.launch(_req(env, _n(env, 2), fleet, rid))
    try:
        assert sorted(i.id for i in again) == sorted(i.id for i in first)
        assert len(await env.provider.list_tagged({TAG_FLEET: fleet})) == _n(env, 2)
    finally:
        await env.provider.terminate([i.id for i in first])


@pytest.mark.parametrize("n", [1, 5])
async def test_batching_uses_at_most_ceil_n_over_batch_calls(env, n):
    counting = CountingProvider(env.provider)
    prov = Provisioner(InProcessBackend(), RetryPolicy(attempts=3, backoff_s=0.01))
    fleet = f"c-{uuid.uuid4().hex[:6]}"
    n = _n(env, n)
    out = await prov.launch({env.name: counting}, [env.offer], env.spec, n, _tags(fleet))
    try:
        assert len(out.instances) == n
        assert len(counting.launches) <= math.ceil(n / env.provider.capabilities.max_batch)
    finally:
        await env.provider.terminate([i.id for i in out.instances])


async def test_capacity_error_maps_with_cause(env):
    with env.exhaust_capacity():
        with pytest.raises(CapacityError) as ei:
            await env.provider.launch(_req(env, 1, f"c-{uuid.uuid4().hex[:6]}"))
    err = ei.value
    assert isinstance(err, ProviderError) and err.provider == env.name and err.code
    if env.name not in ("local", "ssh"):   # a cloud API error is chained as the cause (host slices have none)
        assert err.__cause__ is not None


async def test_bad_offer_is_a_spec_error_before_launch(env):
    bad = env.offer.__class__(**{**{f: getattr(env.offer, f) for f in env.offer.__dataclass_fields__},
                                 "provider": "elsewhere"})
    with pytest.raises((SpecError, FlowMeshError)):
        await env.provider.launch(LaunchRequest(offer=bad, spec=env.spec, count=1, request_id="bad",
                                                tags=_tags("bad")))
    assert await env.provider.list_tagged({TAG_FLEET: "bad"}) == []


async def test_gc_finds_and_terminates_an_orphan_after_a_coordinator_crash(env):
    fleet = f"crash-{uuid.uuid4().hex[:6]}"
    proc = subprocess.Popen([sys.executable, str(HERE / "_coordinator.py"), json.dumps(list(env.rebuild)), fleet],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    try:
        line = proc.stdout.readline()
        assert line.strip(), proc.stderr.read() if proc.poll() is not None else "no output"
        ids = set(line.split())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert {i.id for i in await env.provider.list_tagged({TAG_FLEET: fleet})} == ids
    plan = await gc.plan([env.provider], None)
    orphans = {o.instance_id for o in plan.instances if o.fleet == fleet}
    assert orphans == ids and all(o.reason == "owner process exited" for o in plan.instances
                                  if o.fleet == fleet)
    result = await gc.execute(gc.GcPlan(tuple(o for o in plan.instances if o.fleet == fleet), ()),
                              [env.provider], None)
    assert set(result.terminated) == ids and not result.still_present
    assert await env.provider.list_tagged({TAG_FLEET: fleet}) == []   # zero left running


async def test_cli_gc_sweeps_ec2_orphans(moto_ec2, tmp_path):
    """`flowmesh gc --provider ec2` finds a crashed coordinator's instances by their tags."""
    from flowmesh_providers.ec2.conformance import rebuild_options
    fleet = f"cli-{uuid.uuid4().hex[:6]}"
    recipe = json.dumps(["flowmesh_providers.ec2.conformance:rebuild", rebuild_options(moto_ec2)])
    proc = subprocess.Popen([sys.executable, str(HERE / "_coordinator.py"), recipe, fleet],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ids = set(proc.stdout.readline().split())
        assert ids, proc.stderr.read() if proc.poll() is not None else "no output"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    keys = moto_ec2.session_kwargs  # dummy keys for moto, given to the CLI process only
    env = dict(os.environ, FLOWMESH_HOME=str(tmp_path), COLUMNS="200",
               FLOWMESH_EC2_ENDPOINT_URL=moto_ec2.endpoint_url, AWS_DEFAULT_REGION="us-east-1",
               AWS_ACCESS_KEY_ID=keys["aws_access_key_id"], AWS_SECRET_ACCESS_KEY=keys["aws_secret_access_key"])
    cli = [sys.executable, "-m", "flowmesh_sdk.cli.main", "gc", "--provider", "ec2"]
    dry = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert all(i in dry.stdout for i in ids) and "dry run" in dry.stdout
    real = subprocess.run(cli + ["--yes"], capture_output=True, text=True, env=env, timeout=120)
    assert real.returncode == 0, real.stdout + real.stderr
    prov = moto_ec2.provider()
    try:
        assert await prov.list_tagged({TAG_FLEET: fleet}) == []
    finally:
        await prov.close()
