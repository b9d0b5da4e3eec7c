"""agent-sandbox where installed: the emulator serves kubernetes-sigs/agent-sandbox's CRDs
(``KubeEmulator(agent_sandbox=True)``, v1beta1 as release v0.5.6 publishes them) and runs
their controllers on real podman pods; the ``k8s`` provider detects them and, when asked
(``K8sProvider(agent_sandbox=True)``), fills a persistent pool's warm stock with
SandboxClaims on a SandboxWarmPool it creates.  The objects are read back with the official
client's CustomObjectsApi and with kubectl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flowmesh_sdk import Fleet, PoolSpec, SpecError, gc
from flowmesh_sdk.config import Owner
from flowmesh_sdk.pools import WarmPodPool
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, TAG_RUN, LeftoverScan

pytest.importorskip("kubernetes")

from kubernetes import client  # noqa: E402

from flowmesh_providers.k8s import K8sProvider  # noqa: E402
from flowmesh_providers.k8s.pods import TAGS  # noqa: E402

from ._k8s import SPEC, emu, image  # noqa: E402,F401 - fixtures

EXT, CORE, V = "extensions.agents.x-k8s.io", "agents.x-k8s.io", "v1beta1"
NS = "default"


@pytest.fixture(scope="module")
def asb(k8s_emulator):
    """An emulator with agent-sandbox installed, pulling the module's image from its registry."""
    from flowmesh_sdk.testing.k8s import KubeEmulator
    with KubeEmulator(agent_sandbox=True) as e:
        yield e


@pytest.fixture(scope="module")
def custom(asb):
    return client.CustomObjectsApi(asb.api_client())


async def _until(cond: Callable[[], Any], timeout_s: float = 90.0) -> Any:
    """``cond()``'s first truthy value, asked off the loop (it may call the API)."""
    async with asyncio.timeout(timeout_s):
        while True:
            got = await asyncio.to_thread(cond)
            if got:
                return got
            await asyncio.sleep(0.1)


def _when(get: Callable[[], Any], ok: Callable[[Any], bool]) -> Callable[[], Any]:
    """For :func:`_until`: what ``get()`` returns, once ``ok`` holds for it."""
    def ask() -> Any:
        got = get()
        return got if ok(got) else None
    return ask


def _items(custom: Any, group: str, plural: str) -> list[dict[str, Any]]:
    return list(custom.list_namespaced_custom_object(group, V, NS, plural)["items"])


def _ready(obj: dict[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or ()
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _pod_spec(image: str) -> dict[str, Any]:
    return {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}]}


# ---- the emulator, with the official client ---------------------------------------------------------
def test_discovery_lists_the_groups_only_where_installed(asb, emu):
    groups = {g.name: g for g in client.ApisApi(asb.api_client()).get_api_versions().groups}
    assert groups[EXT].preferred_version.group_version == f"{EXT}/{V}"
    assert groups[CORE].preferred_version.version == V
    plain = {g.name for g in client.ApisApi(emu.api_client()).get_api_versions().groups}
    assert EXT not in plain and CORE not in plain


async def test_a_warm_pool_keeps_ready_sandboxes_and_a_claim_adopts_one(asb, custom, image):
    body = {"apiVersion": f"{EXT}/{V}", "kind": "SandboxTemplate", "metadata": {"name": "t1"},
            "spec": {"podTemplate": {"metadata": {"labels": {"app": "t1"}}, "spec": _pod_spec(image)},
                     "networkPolicyManagement": "Unmanaged"}}
    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxtemplates", body)
    pool = custom.create_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxWarmPool", "metadata": {"name": "p1"},
        "spec": {"replicas": 2, "sandboxTemplateRef": {"name": "t1"}}})
    assert pool["spec"]["replicas"] == 2
    await _until(lambda: (custom.get_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", "p1").get("status")
                          or {}).get("readyReplicas") == 2)
    warm = {s["metadata"]["name"] for s in _items(custom, CORE, "sandboxes")}
    assert len(warm) == 2 and all(n.startswith("p1-") for n in warm)
    core = client.CoreV1Api(asb.api_client())
    for name in warm:   # each sandbox is a running pod of its own name, owned by it
        pod = core.read_namespaced_pod(name, NS)
        assert pod.status.phase == "Running" and pod.metadata.owner_references[0].kind == "Sandbox"
        assert pod.metadata.labels["app"] == "t1"

    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxclaims", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxClaim", "metadata": {"name": "c1"},
        "spec": {"warmPoolRef": {"name": "p1"},
                 "additionalPodMetadata": {"labels": {"sandbox.users.io/run": "r1"}}}})
    claim = await _until(_when(lambda: custom.get_namespaced_custom_object(EXT, V, NS, "sandboxclaims", "c1"),
                               _ready))
    bound = claim["status"]["sandbox"]["name"]
    assert bound in warm                                   # adopted, not made
    assert claim["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"] == bound
    sb = custom.get_namespaced_custom_object(CORE, V, NS, "sandboxes", bound)
    assert sb["metadata"]["ownerReferences"][0]["kind"] == "SandboxClaim"
    assert "agents.x-k8s.io/warm-pool-sandbox" not in sb["metadata"]["labels"]
    pod = await _until(_when(lambda: core.read_namespaced_pod(bound, NS), lambda p: p.metadata.labels.get(
        "agents.x-k8s.io/claim-uid") == claim["metadata"]["uid"]))
    assert pod.metadata.labels["sandbox.users.io/run"] == "r1"
    # the pool refills to two unclaimed sandboxes
    await _until(lambda: len({s["metadata"]["name"] for s in _items(custom, CORE, "sandboxes")} - {bound}) == 2
                 and custom.get_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", "p1")["status"]
                 ["readyReplicas"] == 2)

    custom.delete_namespaced_custom_object(EXT, V, NS, "sandboxclaims", "c1")   # its sandbox and pod go with it
    await _until(lambda: bound not in {s["metadata"]["name"] for s in _items(custom, CORE, "sandboxes")}
                 and bound not in {p.metadata.name for p in core.list_namespaced_pod(NS).items})

    bad = custom.create_namespaced_custom_object(EXT, V, NS, "sandboxclaims", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxClaim", "metadata": {"name": "c2"},
        "spec": {"warmPoolRef": {"name": "p1"}, "additionalPodMetadata": {"labels": {"flowmesh.io/x": "y"}}}})
    assert bad["metadata"]["name"] == "c2"
    cond = await _until(lambda: next(iter((custom.get_namespaced_custom_object(EXT, V, NS, "sandboxclaims", "c2")
                                           .get("status") or {}).get("conditions") or ()), None))
    assert cond["reason"] == "InvalidMetadata" and "not in the allowlist" in cond["message"]
    custom.delete_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", "p1")   # its sandboxes go
    await _until(lambda: not _items(custom, CORE, "sandboxes"))
    for plural in ("sandboxclaims", "sandboxtemplates"):
        custom.delete_collection_namespaced_custom_object(EXT, V, NS, plural)


def test_a_claim_without_its_required_field_is_invalid(custom):
    with pytest.raises(client.exceptions.ApiException) as err:
        custom.create_namespaced_custom_object(EXT, V, NS, "sandboxclaims", {
            "apiVersion": f"{EXT}/{V}", "kind": "SandboxClaim", "metadata": {"name": "nope"}, "spec": {}})
    assert err.value.status == 422 and "spec.warmPoolRef.name: Required value" in err.value.body


# ---- the provider -------------------------------------------------------------------------------------
@pytest.fixture
async def asb_prov(asb, tmp_path):
    from flowmesh_providers.k8s import K8sProvider
    p = K8sProvider(kubeconfig=str(asb.kubeconfig(tmp_path / "kubeconfig")), schedule_timeout_s=30,
                    agent_sandbox=True)
    yield p
    await p.terminate([i.id for i in await p.list_tagged({})])
    await p.close()                                                # its warm pools and templates go with it
    custom = client.CustomObjectsApi(asb.api_client())
    await _until(lambda: not _items(custom, EXT, "sandboxwarmpools") and not _items(custom, CORE, "sandboxes"))


async def test_detection_says_where_agent_sandbox_is_served(asb_prov, emu, tmp_path):
    from flowmesh_providers.k8s import K8sProvider
    on = await asb_prov.agent_sandbox_support()
    assert on.served and "v1beta1" in on.versions
    plain = K8sProvider(kubeconfig=str(emu.kubeconfig(tmp_path / "plain")))
    try:
        off = await plain.agent_sandbox_support()
        assert not off.served and "not installed" in off.reason
    finally:
        await plain.close()


def test_the_option_is_a_boolean():
    from flowmesh_providers.k8s import K8sProvider
    with pytest.raises(SpecError, match="k8s.agent_sandbox.*True or False"):
        K8sProvider(agent_sandbox="yes")  # type: ignore[arg-type]


def _stocked(pool: WarmPodPool) -> set[str]:
    return {mi.id for shape in pool._shapes.values() for mi, _ in shape.stock}


async def test_a_persistent_pool_claims_its_warm_pods_from_a_warm_pool(fm_home, asb, asb_prov, custom, image):
    async with Fleet("k8s-asb", home=fm_home, providers={"k8s": asb_prov}) as fleet:
        pool = await fleet.pool(PoolSpec(name="asb", mode="persistent", provider="k8s", instance=SPEC,
                                         max_instances=3, warm_images=(image,)))
        assert isinstance(pool, WarmPodPool)
        (warm,) = _stocked(pool)
        (swp,) = _items(custom, EXT, "sandboxwarmpools")          # made by the provider for the shape
        assert swp["spec"]["replicas"] == 1
        (tmpl,) = _items(custom, EXT, "sandboxtemplates")
        pinned = tmpl["spec"]["podTemplate"]["spec"]["containers"][0]["image"]
        assert pinned.startswith(image.rsplit(":", 1)[0] + "@sha256:")   # the pool's image, pinned by digest
        (claim,) = _items(custom, EXT, "sandboxclaims")            # the stocked pod is a claim's
        assert claim["spec"]["warmPoolRef"]["name"] == swp["metadata"]["name"] and _ready(claim)
        pod_name = claim["status"]["sandbox"]["name"]
        assert pool.instances[warm].instance.address == pod_name
        core = client.CoreV1Api(asb.api_client())
        assert core.read_namespaced_pod(pod_name, NS).metadata.uid == warm
        creates = asb.count("create", "pods")
        async with pool.sandbox(image=image) as sb:
            assert sb.instance_id == warm
            out = await sb.exec("echo claimed; hostname")
            assert out.stdout.splitlines()[0] == "claimed"
        assert asb.count("create", "pods") == creates              # no pod is the SDK's own
        # the used claim is deleted (its sandbox and pod with it); the SDK's stock is a new claim
        await _until(lambda: claim["metadata"]["name"] not in {c["metadata"]["name"]
                                                               for c in _items(custom, EXT, "sandboxclaims")})
        await _until(lambda: pod_name not in {p.metadata.name for p in core.list_namespaced_pod(NS).items})
        await _until(lambda: len(_stocked(pool)) == 1 and _stocked(pool) != {warm})
        # and the warm pool refills behind it
        await _until(lambda: (custom.get_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools",
                                                                  swp["metadata"]["name"]).get("status") or {})
                     .get("readyReplicas") == 1)
        kubectl = _kubectl(asb, fm_home)
        if kubectl is not None:
            res = kubectl("get", "sandboxclaims", "-o", "name")
            assert res.returncode == 0, res.stderr
            names = {c["metadata"]["name"] for c in _items(custom, EXT, "sandboxclaims")}
            assert set(res.stdout.split()) == {f"sandboxclaim.{EXT}/{n}" for n in names}
            res = kubectl("get", "swp", "-o", "jsonpath={.items[*].status.readyReplicas}")
            assert res.returncode == 0 and res.stdout.strip() == "1", res.stderr
        listed = {i.id for i in await asb_prov.list_tagged({"flowmesh:pool": "asb"})}
        assert listed == _stocked(pool)                            # the warm pool's own pods are not instances
    assert await asb_prov.list_tagged({"flowmesh:pool": "asb"}) == []


async def test_without_the_option_a_persistent_pool_keeps_its_own_pods(fm_home, asb, custom, image, tmp_path):
    from flowmesh_providers.k8s import K8sProvider
    prov = K8sProvider(kubeconfig=str(asb.kubeconfig(tmp_path / "kc")), schedule_timeout_s=30)
    try:
        async with Fleet("k8s-asb-off", home=fm_home, providers={"k8s": prov}) as fleet:
            pool = await fleet.pool(PoolSpec(name="own", mode="persistent", provider="k8s", instance=SPEC,
                                             max_instances=2, warm_images=(image,)))
            assert len(_stocked(pool)) == 1
            assert not _items(custom, EXT, "sandboxclaims") and not _items(custom, EXT, "sandboxwarmpools")
            async with pool.sandbox(image=image) as sb:
                assert (await sb.exec("echo own")).stdout == "own\n"
    finally:
        await prov.close()


def _kubectl(emu: Any, home: Path) -> Callable[..., subprocess.CompletedProcess[str]] | None:
    exe = shutil.which("kubectl")
    if exe is None:
        return None
    config = emu.kubeconfig(home / "kubectl" / "config")
    env = dict(os.environ, KUBECONFIG=str(config), KUBECACHEDIR=str(config.parent / "cache"), HOME=str(config.parent),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=120)
    return run


# ---- gc: a crashed coordinator's warm pools ---------------------------------------------------------
COORDINATOR = textwrap.dedent("""
    import asyncio, sys
    from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec
    from flowmesh_providers.k8s import K8sProvider
    KUBECONFIG, IMAGE, FLEET, RUN = sys.argv[1:5]
    async def main():
        prov = K8sProvider(kubeconfig=KUBECONFIG, schedule_timeout_s=30, agent_sandbox=True)
        fleet = Fleet(FLEET, run=RUN, providers={"k8s": prov})
        await fleet.pool(PoolSpec(name="asb", mode="persistent", provider="k8s", max_instances=2,
                                  instance=InstanceSpec(cpus=1, memory_gb=1), warm_images=(IMAGE,)))
        print("READY", fleet.owner, flush=True)
        await asyncio.sleep(3600)
    asyncio.run(main())
""")


def _crashed_coordinator(kubeconfig: Path, image: str, fleet: str, run: str, tmp_path: Path) -> str:
    """Run a coordinator whose persistent pool stocks a claim from its warm pool, then kill -9 it;
    returns its owner tag."""
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR)
    proc = subprocess.Popen([sys.executable, str(script), str(kubeconfig), image, fleet, run],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("READY"):
            proc.kill()
            pytest.fail(f"coordinator did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return line.split()[1]


def _gc_cli(home: Path, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FLOWMESH_HOME=str(home), KUBECONFIG=str(kubeconfig), COLUMNS="250")
    return subprocess.run([sys.executable, "-m", "flowmesh_sdk.cli.main", "gc", "-p", "k8s", *args],
                          capture_output=True, text=True, env=env, timeout=300)


async def test_gc_reaps_the_warm_pool_of_a_crashed_coordinator(fm_home, asb, custom, image, tmp_path):
    kubeconfig = asb.kubeconfig(tmp_path / "kc")
    owner = await asyncio.to_thread(_crashed_coordinator, kubeconfig, image, "asb-crash", "run-1", tmp_path)
    parsed = Owner.parse(owner)
    assert parsed is not None and parsed.alive() is False          # killed: its owner tag names a dead process
    (swp,) = _items(custom, EXT, "sandboxwarmpools")               # left behind, and kept full
    name = swp["metadata"]["name"]
    assert [t["metadata"]["name"] for t in _items(custom, EXT, "sandboxtemplates")] == [name]
    labels = TAGS.decode(swp["metadata"]["labels"])
    assert {k: labels.get(k) for k in (TAG_OWNER, TAG_FLEET, TAG_POOL, TAG_RUN)} == {
        TAG_OWNER: owner, TAG_FLEET: "asb-crash", TAG_POOL: "asb", TAG_RUN: "run-1"}
    warm = await _until(lambda: [s["metadata"]["name"] for s in _items(custom, CORE, "sandboxes")
                                 if s["metadata"]["name"].startswith(name)])
    core = client.CoreV1Api(asb.api_client())
    assert set(warm) <= {p.metadata.name for p in core.list_namespaced_pod(NS).items}

    dry = await asyncio.to_thread(_gc_cli, fm_home, kubeconfig, "--json")   # as a user runs it
    assert dry.returncode == 0, dry.stdout + dry.stderr
    found = json.loads(dry.stdout)["found"]
    (lo,) = found["leftovers"]
    assert (lo["provider"], lo["kind"], lo["machine"], lo["container_name"], lo["owner"], lo["fleet"], lo["pool"],
            lo["run"], lo["reason"]) == ("k8s", "SandboxWarmPool", f"emu/{NS}", name, owner, "asb-crash", "asb",
                                         "run-1", "owner process exited")
    assert [i["owner"] for i in found["instances"]] == [owner]    # the stocked claim's pod
    table = await asyncio.to_thread(_gc_cli, fm_home, kubeconfig)
    assert table.returncode == 0 and "SandboxWarmPool" in table.stdout and name in table.stdout, table.stdout
    assert _items(custom, EXT, "sandboxwarmpools")                 # a dry run removes nothing

    gc_prov = K8sProvider(kubeconfig=str(kubeconfig))              # as `flowmesh gc -p k8s` loads it
    try:
        plan = await gc.plan([gc_prov], None, leftovers=True, fleet="asb-crash")
        ((prov_name, taken),) = plan.found_leftovers
        assert prov_name == "k8s" and taken.kind == "SandboxWarmPool" and taken.container_id == swp["metadata"]["uid"]
        assert (await gc.plan([gc_prov], None, leftovers=True, run="run-2")).found_leftovers == ()
        res = await gc.execute(plan, [gc_prov], None)
        assert [(lo.kind, lo.container_name) for lo in res.swept] == [("SandboxWarmPool", name)]
        assert len(res.terminated) == 1 and not res.unreachable
        assert not _items(custom, EXT, "sandboxwarmpools") and not _items(custom, EXT, "sandboxtemplates")
        await _until(lambda: not _items(custom, CORE, "sandboxes") and not _items(custom, EXT, "sandboxclaims"))
        await _until(lambda: not set(warm) & {p.metadata.name for p in core.list_namespaced_pod(NS).items})
        again = await gc.plan([gc_prov], None, leftovers=True)
        assert again.found_leftovers == () and again.instances == ()
    finally:
        await gc_prov.close()


async def test_gc_leaves_a_live_coordinators_warm_pool_alone(fm_home, asb, asb_prov, custom, image, tmp_path):
    gc_prov = K8sProvider(kubeconfig=str(asb.kubeconfig(tmp_path / "gc")))
    try:
        async with Fleet("asb-live", home=fm_home, run="live-run", providers={"k8s": asb_prov}) as fleet:
            await fleet.pool(PoolSpec(name="live", mode="persistent", provider="k8s", instance=SPEC,
                                      max_instances=2, warm_images=(image,)))
            (swp,) = _items(custom, EXT, "sandboxwarmpools")
            assert await asb_prov.leftovers() == LeftoverScan("k8s")    # its own pool is no leftover
            for kwargs in ({}, {"run": "live-run"}, {"older_than_s": 0.0}):
                plan = await gc.plan([gc_prov], None, leftovers=True, **kwargs)
                assert plan.found_leftovers == () and plan.instances == (), kwargs   # the owner runs
            plan = await gc.plan([gc_prov], None, leftovers=True, include_live=True)
            ((_, lo),) = plan.found_leftovers
            assert (lo.container_name, lo.owner, lo.reason) == (swp["metadata"]["name"], fleet.owner,
                                                                "owner running, --all")
            assert (await gc.plan([gc_prov], None, leftovers=True, include_live=True,
                                  fleet="another")).found_leftovers == ()
    finally:   # the provider's close (the fixture's) deletes the warm pool
        await gc_prov.close()


async def test_gc_takes_an_other_hosts_warm_pool_only_by_run_or_age(fm_home, asb, custom, image, tmp_path):
    tags = {TAG_FLEET: "far", TAG_POOL: "p", TAG_OWNER: "elsewhere.example/4242/99", TAG_RUN: "far-run"}
    name = "fm-swp-elsewhere"
    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxtemplates", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxTemplate", "metadata": {"name": name, "labels": TAGS.encode(tags)},
        "spec": {"podTemplate": {"spec": _pod_spec(image)}, "networkPolicyManagement": "Unmanaged"}})
    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxWarmPool", "metadata": {"name": name, "labels": TAGS.encode(tags)},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": name}}})
    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", {   # the user's own: never gc's
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxWarmPool", "metadata": {"name": "users-own"},
        "spec": {"replicas": 1, "sandboxTemplateRef": {"name": name}}})
    gc_prov = K8sProvider(kubeconfig=str(asb.kubeconfig(tmp_path / "gc")))
    try:
        assert (await gc.plan([gc_prov], None, leftovers=True)).found_leftovers == ()   # its owner may run
        every = await gc.plan([gc_prov], None, leftovers=True, include_live=True)
        assert [lo.container_name for _, lo in every.found_leftovers] == [name]
        assert (await gc.plan([gc_prov], None, leftovers=True, run="near-run")).found_leftovers == ()
        by_run = await gc.plan([gc_prov], None, leftovers=True, run="far-run")
        assert [lo.reason for _, lo in by_run.found_leftovers] == ["owner on elsewhere.example, of run far-run"]
        by_age = await gc.plan([gc_prov], None, leftovers=True, older_than_s=0.0)
        assert [lo.reason for _, lo in by_age.found_leftovers] == ["owner on elsewhere.example, older than 0 s"]
        assert (await gc.plan([gc_prov], None, leftovers=True, older_than_s=3600.0)).found_leftovers == ()
        real = await asyncio.to_thread(_gc_cli, fm_home, asb.kubeconfig(tmp_path / "kc"), "--run", "far-run", "--yes")
        assert real.returncode == 0, real.stdout + real.stderr
        assert "terminated 0 instance(s), removed 0 container(s), 1 SandboxWarmPool(s)" in real.stdout
        assert [p["metadata"]["name"] for p in _items(custom, EXT, "sandboxwarmpools")] == ["users-own"]
        assert not _items(custom, EXT, "sandboxtemplates")
    finally:
        custom.delete_namespaced_custom_object(EXT, V, NS, "sandboxwarmpools", "users-own")
        await gc_prov.close()
    await _until(lambda: not _items(custom, CORE, "sandboxes"))


async def test_a_claim_launch_that_fails_takes_back_the_pods_it_bound_at_once(asb, asb_prov, custom, image):
    """All or nothing: the second of two claims is refused (one made before, its metadata not
    allowed), so the first, bound, is deleted too; its pod is not listed from then on, whatever
    the provider's watch has seen yet."""
    from flowmesh_providers.k8s.pods import pod_name
    from flowmesh_sdk import SandboxSpec
    from flowmesh_sdk.errors import ProviderError
    from flowmesh_sdk.provider import TAG_REQUEST, ContainerRequest, LaunchRequest
    offer = (await asb_prov.offers(SPEC))[0]
    tags = {TAG_FLEET: "rb", TAG_POOL: "rb"}

    def request(rid: str, count: int) -> LaunchRequest:
        return LaunchRequest(offer=offer, spec=SPEC, count=count, request_id=rid, tags=tags, container=ContainerRequest(
            image, SandboxSpec(image=image, cpus=0.5, memory_gb=0.25), stock=1))

    first = await asb_prov.launch(request("rb0", 1))   # the provider's warm pool, for the claim below
    await asb_prov.terminate([i.id for i in first])
    (swp,) = _items(custom, EXT, "sandboxwarmpools")
    custom.create_namespaced_custom_object(EXT, V, NS, "sandboxclaims", {
        "apiVersion": f"{EXT}/{V}", "kind": "SandboxClaim",
        "metadata": {"name": pod_name("rb1", 1), "labels": TAGS.encode({**tags, TAG_REQUEST: "rb1"})},
        "spec": {"warmPoolRef": {"name": swp["metadata"]["name"]},
                 "additionalPodMetadata": {"labels": {"flowmesh.io/x": "y"}}}})
    with pytest.raises(ProviderError, match="InvalidMetadata"):
        await asb_prov.launch(request("rb1", 2))
    assert await asb_prov.list_tagged({TAG_POOL: "rb"}) == []
    assert pod_name("rb1", 0) not in {c["metadata"]["name"] for c in _items(custom, EXT, "sandboxclaims")}
