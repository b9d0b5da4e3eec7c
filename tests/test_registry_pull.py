"""Registry-pull image provisioning against the real docker-registry and podman: digest
pinning, fail-fast dispatch, one pull per image per instance, shared base layers, the pull
budget under 429s and outages, corrupt layers, private registries, eviction, prefetch."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk import (AuthError, EventKind, Fleet, ImageNotFoundError, InfraFailure, InstanceSpec, PoolSpec,
                          SandboxSpec, Task)
from flowmesh_sdk.errors import RegistryUnavailableError
from flowmesh_sdk.images import PullPolicy
from flowmesh_sdk.registry.auth import Credentials
from flowmesh_sdk.registry.client import DOCKER_LIST, OCI_INDEX, RegistryClient
from flowmesh_sdk.testing.proxy import FaultProxy
from flowmesh_sdk.registry.local import LocalRegistry
from flowmesh_sdk.testing.tokenserver import TokenServer
from flowmesh_providers.local import LocalProvider

FAST = PullPolicy(attempts=3, backoff_s=0.05, backoff_max_s=0.2)


@pytest.fixture(scope="module")
def registry(busybox_image):
    with LocalRegistry() as reg:
        reg.push(busybox_image, "flowmesh/busybox:1")
        host = reg.host
        yield reg
    _forget_images_from(host)


@pytest.fixture
def proxy(registry):
    with FaultProxy(registry.host) as px:
        host = px.host
        yield px
    _forget_images_from(host)


def _forget_images_from(host: str) -> None:
    """Drop what the tests pulled from a registry that is going away."""
    ids = subprocess.run(["podman", "images", "-q", "--filter", f"reference={host}/*/*"],
                         capture_output=True, text=True).stdout.split()
    if ids:
        subprocess.run(["podman", "rmi", "-f", *set(ids)], capture_output=True)


def make_image(reg: LocalRegistry, base: str, tmp: Path, name: str, content: str | None = None) -> tuple[str, str]:
    """Build base + one new layer, push it, drop the local copy: (reference in the registry,
    digest of the new layer's content file)."""
    ctx = tmp / f"ctx-{uuid.uuid4().hex[:6]}"
    ctx.mkdir()
    (ctx / "data").write_text(content or uuid.uuid4().hex)
    (ctx / "Containerfile").write_text(f"FROM {base}\nCOPY data /data\n")
    local = f"localhost/fmtest/{name}:{uuid.uuid4().hex[:8]}"
    subprocess.run(["podman", "build", "-q", "--pull=never", "-t", local, str(ctx)], check=True,
                   capture_output=True)
    ref = reg.push(local, f"fmtest/{name}:1")
    subprocess.run(["podman", "rmi", local], check=True, capture_output=True)
    return ref, reg.pushed[ref]


def via(proxy: FaultProxy, ref: str, reg: LocalRegistry) -> str:
    return ref.replace(reg.host, proxy.host, 1)


@pytest.fixture
async def rfleet(fm_home):
    prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "local")
    async with Fleet("reg", home=fm_home, providers={"local": prov}, pull_policy=FAST) as f:
        yield f


def _spec(image: str) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=1, memory_gb=0.25)


def _drain(sub) -> list:
    out = []
    while not sub.queue.empty():
        out.append(sub.queue.get_nowait())
    return out


async def test_client_resolves_manifest_digest_and_layers(registry):
    async with RegistryClient(use_auth_files=False) as client:
        ref = f"{registry.host}/flowmesh/busybox:1"
        res = await client.resolve(ref)
        assert res.digest == registry.pushed[ref]
        assert res.pinned == f"{registry.host}/flowmesh/busybox@{res.digest}"
        assert res.layers and all(layer.size > 0 for layer in res.layers)
        assert (await client.resolve(res.pinned)).digest == res.digest
        assert await client.exists(ref) and not await client.exists(f"{registry.host}/flowmesh/busybox:nope")
        with pytest.raises(ImageNotFoundError, match="MANIFEST_UNKNOWN|NAME_UNKNOWN"):
            await client.resolve(f"{registry.host}/nobody/here:1")


async def test_sandbox_is_pinned_and_a_moved_tag_does_not_mix(rfleet, registry, busybox_image, tmp_path):
    a, b = f"A-{uuid.uuid4().hex}", f"B-{uuid.uuid4().hex}"
    ref_a, digest_a = make_image(registry, busybox_image, tmp_path, "moving", a)
    pool = await rfleet.pool(PoolSpec(name="pin", instance=InstanceSpec(cpus=1, memory_gb=2),
                                      sandboxes_per_instance=2, warm_per_image=0))
    async with pool.sandbox(_spec(ref_a)) as sb:
        assert sb.image_id == digest_a
        assert (await sb.exec("cat /data")).stdout == a
        name = subprocess.run(["podman", "inspect", "--format", "{{.ImageName}}", sb.container_id],
                              check=True, capture_output=True, text=True).stdout.strip()
        assert name.endswith(f"@{digest_a}")
    ref_b, digest_b = make_image(registry, busybox_image, tmp_path, "moving", b)
    assert ref_b == ref_a and digest_b != digest_a      # the tag moved in the registry
    async with pool.sandbox(_spec(ref_a)) as sb:       # same step (within the TTL): still A
        assert sb.image_id == digest_a and (await sb.exec("cat /data")).stdout == a
    res = await pool.run_task(Task(name="pinned", sandbox=_spec(ref_a), command="cat /data"))
    assert res.image_digest == digest_a and res.result.stdout == a


async def test_one_pull_per_image_per_instance_and_only_new_layers(rfleet, registry, proxy,
                                                                  busybox_image, tmp_path):
    ref, _ = make_image(registry, busybox_image, tmp_path, "burst")
    image = via(proxy, ref, registry)
    async with RegistryClient(use_auth_files=False) as client:
        resolved = await client.resolve(image)
        base = await client.resolve(f"{registry.host}/flowmesh/busybox:1")
    new_layers = [layer.digest for layer in resolved.layers if layer not in base.layers]
    assert len(new_layers) == 1
    proxy.reset_counts()
    pool = await rfleet.pool(PoolSpec(name="burst", instance=InstanceSpec(cpus=2, memory_gb=4),
                                      sandboxes_per_instance=4, warm_per_image=0))
    pulled = rfleet.bus.subscribe(EventKind.IMAGE_PULLED)

    async def one() -> str:
        async with pool.sandbox(_spec(image)) as sb:
            return (await sb.exec("cat /data")).stdout

    outs = await asyncio.gather(*(one() for _ in range(4)))
    assert len(set(outs)) == 1
    assert len(_drain(pulled)) == 1                       # one pull for four sandboxes
    gets = proxy.blob_gets
    assert gets.get(new_layers[0]) == 1                   # the new layer fetched once
    assert all(gets.get(layer.digest, 0) == 0 for layer in base.layers)   # base layers not at all


async def test_missing_image_and_registry_down_fail_before_any_launch(rfleet, registry, proxy):
    pool = await rfleet.pool(PoolSpec(name="down", mode="ephemeral", instance=InstanceSpec(cpus=1, memory_gb=1)))
    events = rfleet.bus.subscribe()
    with pytest.raises(ImageNotFoundError):
        async with pool.sandbox(_spec(f"{registry.host}/flowmesh/busybox:no-such-tag")):
            pass
    proxy.down()
    try:
        with pytest.raises(RegistryUnavailableError, match="unreachable"):
            async with pool.sandbox(_spec(f"{proxy.host}/flowmesh/busybox:1")):
                pass
    finally:
        proxy.up()
    kinds = [e.kind for e in _drain(events)]
    assert EventKind.INSTANCE_REQUESTED not in kinds
    assert kinds.count(EventKind.IMAGE_PULL_RETRY) == FAST.attempts - 1   # retried per policy, visibly
    assert kinds.count(EventKind.TASK_REJECTED) == 2
    # as a task: a result that says the image was the infrastructure's failure, not the task's
    res = await pool.run_task(Task(name="t", sandbox=_spec(f"{registry.host}/flowmesh/busybox:no-such-tag"),
                                   command="true"))
    assert (res.infra_failure, res.result, res.attempts) == (InfraFailure.IMAGE_PULL, None, 1), res
    assert "ImageNotFoundError" in (res.error or "")


async def test_throttled_registry_backs_off_without_failing(rfleet, registry, proxy, busybox_image, tmp_path):
    ref, _ = make_image(registry, busybox_image, tmp_path, "throttled")
    pool = await rfleet.pool(PoolSpec(name="tt", instance=InstanceSpec(cpus=1, memory_gb=1)))
    retries = rfleet.bus.subscribe(EventKind.IMAGE_PULL_RETRY)
    proxy.fail_next(2, status=429, retry_after=0, kind="manifest")
    async with pool.sandbox(_spec(via(proxy, ref, registry))) as sb:
        assert (await sb.exec("test -s /data && echo ok")).stdout == "ok\n"
    assert len(_drain(retries)) == 2


async def test_corrupt_layer_is_detected_repulled_and_never_run(rfleet, registry, proxy, busybox_image, tmp_path):
    content = f"intact-{uuid.uuid4().hex}"   # unique: the layer must not be in the store yet
    ref, _ = make_image(registry, busybox_image, tmp_path, "corrupt", content)
    pool = await rfleet.pool(PoolSpec(name="cor", instance=InstanceSpec(cpus=1, memory_gb=1)))
    retries = rfleet.bus.subscribe(EventKind.IMAGE_PULL_RETRY)
    proxy.corrupt_next_blob(1)
    async with pool.sandbox(_spec(via(proxy, ref, registry))) as sb:
        assert (await sb.exec("cat /data")).stdout == content
    details = [e.detail for e in _drain(retries)]
    assert details and "pull" in details[0] and "digest" in details[0].lower()


async def test_private_registry_needs_credentials(fm_home, busybox_image):
    with LocalRegistry(auth="htpasswd") as reg:
        ref = reg.push(busybox_image, "private/busybox:1")
        prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "p1")
        async with Fleet("noauth", home=fm_home, providers={"local": prov}, pull_policy=FAST) as fleet:
            pool = await fleet.pool(PoolSpec(name="p", instance=InstanceSpec(cpus=1, memory_gb=1)))
            with pytest.raises(AuthError, match=f"registry {reg.host} refused anonymous access"):
                async with pool.sandbox(_spec(ref)):
                    pass
        prov = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "p2")
        creds = {reg.host: Credentials(reg.username, reg.password)}
        async with Fleet("auth", home=fm_home, providers={"local": prov}, pull_policy=FAST,
                         registry_credentials=creds) as fleet:
            subprocess.run(["podman", "rmi", "-i", ref], capture_output=True)
            pool = await fleet.pool(PoolSpec(name="p", instance=InstanceSpec(cpus=1, memory_gb=1)))
            async with pool.sandbox(_spec(ref)) as sb:
                assert (await sb.exec("echo in")).stdout == "in\n"
            authfiles = list((fm_home / "auth").glob("*.json"))
            assert authfiles and oct(authfiles[0].stat().st_mode & 0o777) == "0o600"
            assert reg.password not in repr(fleet.registry.credentials(reg.host))


async def test_disk_high_water_evicts_lru_but_never_an_image_in_use(rfleet, registry, busybox_image, tmp_path):
    refs = [make_image(registry, busybox_image, tmp_path, f"evict{i}")[0] for i in range(3)]
    # a budget smaller than one image: every pull crosses the high-water mark
    pool = await rfleet.pool(PoolSpec(name="disk", instance=InstanceSpec(cpus=2, memory_gb=4, disk_gb=1),
                                      sandboxes_per_instance=3, warm_per_image=0, image_cache_gb=1e-6))
    evicted = rfleet.bus.subscribe(EventKind.IMAGE_EVICTED)
    async with pool.sandbox(_spec(refs[0])) as held:
        async with pool.sandbox(_spec(refs[1])):
            pass
        assert _drain(evicted) == []                    # refs[0] in use, refs[1] just pulled
        async with pool.sandbox(_spec(refs[2])):
            pass
        gone = [e.detail for e in _drain(evicted)]
        assert len(gone) == 1 and "evict1" in gone[0]   # the LRU unused image
        assert (await held.exec("cat /data")).exit_code == 0
    (mi,) = pool.instances.values()
    assert all(c.in_use == 0 for c in mi.images.values())


async def test_prefetch_warms_instances_ahead_of_a_step(rfleet, registry, busybox_image, tmp_path):
    ref, digest = make_image(registry, busybox_image, tmp_path, "prefetch")
    pool = await rfleet.pool(PoolSpec(name="pre", instance=InstanceSpec(cpus=1, memory_gb=1),
                                      min_instances=1, warm_per_image=0))
    pulled = rfleet.bus.subscribe(EventKind.IMAGE_PULLED)
    (info,) = await pool.prefetch([ref])
    assert info.digest == digest and len(_drain(pulled)) == 1
    async with pool.sandbox(_spec(ref)) as sb:
        assert sb.image_id == digest
    assert _drain(pulled) == []                          # nothing pulled at acquire time
    with pytest.raises(ImageNotFoundError):
        await pool.prefetch([f"{registry.host}/fmtest/none:1"])


async def test_image_index_is_narrowed_to_the_instance_platform(registry, busybox_image, tmp_path):
    # two different images under one multi-arch index: "arm64" and "amd64"
    other, _ = make_image(registry, busybox_image, tmp_path, "amd64-part", "amd64")
    subprocess.run(["podman", "pull", "-q", "--tls-verify=false", other], check=True, capture_output=True)
    index = f"localhost/fmtest/multi-{uuid.uuid4().hex[:8]}:1"
    try:
        subprocess.run(["podman", "manifest", "create", index], check=True, capture_output=True)
        for arch, src in (("arm64", busybox_image), ("amd64", other)):
            subprocess.run(["podman", "manifest", "add", "--arch", arch, index, f"containers-storage:{src}"],
                           check=True, capture_output=True)
        ref = f"{registry.host}/fmtest/multi:1"
        subprocess.run(["podman", "manifest", "push", "--all", "--tls-verify=false", index, f"docker://{ref}"],
                       check=True, capture_output=True)
    finally:
        subprocess.run(["podman", "manifest", "rm", index], capture_output=True)
    async with RegistryClient(use_auth_files=False) as client:
        arm, amd = await client.resolve(ref, arch="arm64"), await client.resolve(ref, arch="x86_64")
    assert arm.index_digest == amd.index_digest and arm.digest != amd.digest
    assert (arm.platform, amd.platform) == ("linux/arm64", "linux/amd64")
    entries = {m["platform"]["architecture"]: m["digest"]
               for m in registry.request("GET", "/v2/fmtest/multi/manifests/1", headers={
                   "Accept": f"{OCI_INDEX}, {DOCKER_LIST}"}).json()["manifests"]}
    assert entries == {"arm64": arm.digest, "amd64": amd.digest}


@pytest.mark.parametrize("anonymous_pull", [False, True])
async def test_client_follows_the_bearer_token_challenge(busybox_image, anonymous_pull):
    with LocalRegistry(auth="token", token_server=TokenServer, anonymous_pull=anonymous_pull) as reg:
        ref = reg.push(busybox_image, "tok/busybox:1")
        async with RegistryClient(use_auth_files=False) as anon:
            if anonymous_pull:
                assert (await anon.resolve(ref)).digest == reg.pushed[ref]
            else:
                with pytest.raises(AuthError, match=f"registry {reg.host} refused anonymous access"):
                    await anon.resolve(ref)
        creds = {reg.host: Credentials(reg.username, reg.password)}
        async with RegistryClient(credentials=creds, use_auth_files=False) as client:
            assert (await client.resolve(ref)).digest == reg.pushed[ref]
        bad = {reg.host: Credentials(reg.username, "wrong")}
        async with RegistryClient(credentials=bad, use_auth_files=False) as client:
            with pytest.raises(AuthError, match=f"refused user '{reg.username}'"):
                await client.resolve(ref)


async def test_a_pull_is_one_round_trip_and_its_errors_name_the_pull(registry, busybox_image, tmp_path,
                                                                     recording_runner):
    """On a fresh machine each command is an SSH round trip: presence check, pull and the
    snapshot-label lookup go as one script.  Its failure reads as the pull's."""
    from flowmesh_sdk.remote.runtime import ContainerRuntime

    ref, _ = make_image(registry, busybox_image, tmp_path, "oneshot")
    rt = ContainerRuntime(recording_runner)
    await rt.probe()
    calls = recording_runner.calls
    calls.clear()
    assert await rt.pull(ref, tls_verify=False) is True
    assert len(calls) == 1 and await rt.image_inspect(ref) is not None
    calls.clear()
    assert await rt.pull(ref, tls_verify=False) is False       # the store has it: nothing pulled
    assert len(calls) == 1
    missing = f"{registry.host}/fmtest/none:{uuid.uuid4().hex[:6]}"
    with pytest.raises(ImageNotFoundError) as ei:
        await rt.pull(missing, tls_verify=False)
    assert f"`podman pull --quiet --tls-verify=false {missing}` exit 125" in str(ei.value)
    subprocess.run(["podman", "rmi", "-f", ref], capture_output=True)
