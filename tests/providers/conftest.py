"""Provider environments for the conformance suite: each yields a ready provider, the
offer to launch, and the means to provoke its capacity error.  Every later provider adds
itself to ``ENVIRONMENTS``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from flowmesh_sdk.provider import Provider
from flowmesh_sdk.specs import InstanceSpec, Offer

@pytest.fixture(autouse=True)
def _no_real_cloud(no_real_cloud) -> None:
    """Every provider test runs away from real clouds (see tests/conftest.py)."""


@dataclass
class ProviderEnv:
    name: str
    provider: Provider
    spec: InstanceSpec
    offer: Offer
    # provokes the provider's own capacity error on the next launch of `offer`
    exhaust_capacity: Callable[[], contextlib.AbstractContextManager[None]]
    # how a separate process rebuilds the same provider: JSON for providers/_coordinator.py
    recipe: str


@pytest.fixture(scope="session")
def moto_ec2():
    pytest.importorskip("boto3")
    from flowmesh_sdk.testing.moto import MotoEc2
    with MotoEc2() as m:
        yield m


@pytest.fixture(scope="session")
def ec2_proxy(moto_ec2):
    from flowmesh_sdk.testing.ec2fault import Ec2FaultProxy
    with Ec2FaultProxy(moto_ec2.endpoint_url) as p:
        yield p


ENVIRONMENTS = ["local", "ec2", "ssh", "gce", "alibaba", "vast", "azure"]


@pytest.fixture(scope="session")
def azure_emulator():
    pytest.importorskip("azure.mgmt.compute")
    from flowmesh_sdk.testing.azure import AzureEmulator
    with AzureEmulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def gce_emulator():
    pytest.importorskip("google.cloud.compute_v1")
    from flowmesh_sdk.testing.gce import GceEmulator
    with GceEmulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def ecs_emulator():
    pytest.importorskip("alibabacloud_ecs20140526")
    from flowmesh_sdk.testing.ecs import EcsEmulator
    with EcsEmulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def vast_emulator():
    pytest.importorskip("vastai")
    from flowmesh_sdk.testing.vast import VastEmulator
    with VastEmulator() as emu:
        yield emu


@pytest.fixture(scope="session")
def byo_sshd():
    pytest.importorskip("paramiko")
    from flowmesh_sdk.testing.sshd import LoopbackSshd
    with LoopbackSshd("127.0.0.5") as d:
        yield d


@pytest.fixture(params=ENVIRONMENTS)
async def env(request, tmp_path: Path) -> AsyncIterator[ProviderEnv]:
    spec = InstanceSpec(cpus=2, memory_gb=4)
    if request.param == "local":
        from flowmesh_providers.local import LocalProvider
        state = tmp_path / "local"
        prov = LocalProvider(cpus=16, memory_gb=64, state_dir=state)  # accounting only
        (offer,) = await prov.offers(spec)

        exhaust = _filled_by(lambda: LocalProvider(cpus=16, memory_gb=64, state_dir=state))

        recipe = json.dumps({"provider": "local", "cpus": 16, "memory_gb": 64, "state_dir": str(state)})
        yield ProviderEnv("local", prov, spec, offer, exhaust, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
    elif request.param == "ssh":
        from flowmesh_providers.ssh import SshHost, SshProvider
        d = request.getfixturevalue("byo_sshd")
        state = tmp_path / "ssh"
        host = SshHost(name="box1", host=d.host, port=d.port, user=d.user,
                       key_path=str(d.client_key_path), host_key=d.host_public_key,
                       cpus=16, memory_gb=64)   # accounting only: one real sshd on loopback
        prov = SshProvider([host], state_dir=state)
        (offer,) = await prov.offers(spec)

        exhaust = _filled_by(lambda: SshProvider([host], state_dir=state))

        inventory = tmp_path / "inventory.json"
        inventory.write_text(json.dumps({"hosts": [{
            "name": "box1", "host": d.host, "port": d.port, "user": d.user,
            "key_path": str(d.client_key_path), "host_key": d.host_public_key,
            "cpus": 16, "memory_gb": 64}]}))
        recipe = json.dumps({"provider": "ssh", "inventory": str(inventory), "state_dir": str(state)})
        yield ProviderEnv("ssh", prov, spec, offer, exhaust, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
    elif request.param == "vast":
        emu = request.getfixturevalue("vast_emulator")
        prov = emu.provider(spot=False)
        offer = min(await prov.offers(spec), key=lambda o: (o.price_per_hour or 0, o.offer_id))   # cheapest ask

        @contextlib.contextmanager
        def exhaust_vast() -> Iterator[None]:
            emu.gone(int(offer.offer_id))            # taken between search and create
            try:
                yield
            finally:
                for o in emu.offers:
                    if o["id"] == int(offer.offer_id):
                        o.update(rented=False, _taken=False)

        recipe = json.dumps({"provider": "vast", "server_url": emu.url, "api_key": emu.api_key})
        yield ProviderEnv("vast", prov, spec, offer, exhaust_vast, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
    elif request.param == "alibaba":
        emu = request.getfixturevalue("ecs_emulator")
        prov = emu.provider()
        offer = next(o for o in await prov.offers(spec) if not o.spot)

        @contextlib.contextmanager
        def exhaust_ecs() -> Iterator[None]:
            emu.sold_out(zone=offer.zone, instance_type=offer.instance_type)
            try:
                yield
            finally:
                emu.restock()

        recipe = json.dumps({"provider": "alibaba", "endpoint": emu.url, "vswitch_ids": emu.vswitch_ids,
                             "security_group_id": emu.security_group_id, "key": emu.access_key_id,
                             "secret": emu.access_key_secret})
        yield ProviderEnv("alibaba", prov, spec, offer, exhaust_ecs, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
    elif request.param == "gce":
        emu = request.getfixturevalue("gce_emulator")
        prov = emu.provider()
        offer = next(o for o in await prov.offers(spec) if not o.spot)

        @contextlib.contextmanager
        def exhaust_gce() -> Iterator[None]:
            emu.exhaust(zone=offer.zone)
            try:
                yield
            finally:
                emu.restore()

        recipe = json.dumps({"provider": "gce", "endpoint": emu.url, "project": emu.project,
                             "zones": list(emu.zones)})
        yield ProviderEnv("gce", prov, spec, offer, exhaust_gce, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
    elif request.param == "azure":
        emu = request.getfixturevalue("azure_emulator")
        prov = emu.provider()
        offer = next(o for o in await prov.offers(spec) if not o.spot)

        @contextlib.contextmanager
        def exhaust_azure() -> Iterator[None]:
            emu.exhaust(offer.instance_type)
            try:
                yield
            finally:
                emu.restore()

        recipe = json.dumps({"provider": "azure", "base_url": emu.url, "subscription": emu.subscription,
                             "token": emu.token, "locations": list(emu.locations)})   # a test token
        yield ProviderEnv("azure", prov, spec, offer, exhaust_azure, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()
    else:
        moto = request.getfixturevalue("moto_ec2")
        proxy = request.getfixturevalue("ec2_proxy")
        prov = moto.provider(endpoint_url=proxy.endpoint_url)
        offers = await prov.offers(spec)
        offer = next(o for o in offers if not o.spot)

        @contextlib.contextmanager
        def exhaust() -> Iterator[None]:
            proxy.fail("RunInstances", "InsufficientInstanceCapacity", times=None)
            try:
                yield
            finally:
                proxy.clear()

        recipe = json.dumps({"provider": "ec2", "endpoint_url": moto.endpoint_url,
                             "image_id": moto.a_valid_ami("us-east-1"), "session": moto.session_kwargs})
        yield ProviderEnv("ec2", prov, spec, offer, exhaust, recipe)
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()


def _filled_by(make_filler):
    """A context in which another coordinator (a second provider object on the same state)
    holds all 16 cpus of the carved machine, so the next launch finds no room."""
    @contextlib.contextmanager
    def exhaust() -> Iterator[None]:
        from flowmesh_sdk.provider import LaunchRequest
        filler = make_filler()
        big = InstanceSpec(cpus=16, memory_gb=1)
        launched = []

        async def fill() -> None:
            launched.extend(await filler.launch(LaunchRequest(
                offer=filler._offer(big), spec=big, count=1, request_id="filler",
                tags={"flowmesh:fleet": "filler"})))
        _run(fill())
        try:
            yield
        finally:
            _run(filler.terminate([i.id for i in launched]))
            _run(filler.close())
    return exhaust


def _run(coro) -> None:
    """Run a coroutine from sync code inside a running test loop (on a helper thread)."""
    import asyncio
    import threading
    box: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box.append(exc)
    t = threading.Thread(target=target)
    t.start()
    t.join()
    if box:
        raise box[0]
