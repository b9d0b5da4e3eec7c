"""The GCE emulator checked by a client nobody here wrote: Google's own ``gcloud`` (issue 30),
pointed at it with ``CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE``, a throw-away
``CLOUDSDK_CONFIG`` and ``--access-token-file``; ``GCE_METADATA_ROOT=127.0.0.1:9`` and
``CLOUDSDK_METRICS_ENVIRONMENT`` keep every call on loopback, and the network guard
(tests/_netguard) refuses and logs any that would not.  ``bulk create`` without
``--async`` (patterned and ``--predefined-names``) follows the bulk's ``operationGroupId``
through ``zoneOperations.list`` and counts its per-instance ``insert`` operations; what gcloud
made, the official Python client sees; ``delete`` polls its operation to the end; zones and
machine types are listed (aggregated too) and described; errors are Google's JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import _netguard as netguard
import pytest

pytestmark = pytest.mark.skipif(shutil.which("gcloud") is None, reason="needs gcloud (the machine image has it)")

from flowmesh_sdk.testing.gce import GceEmulator  # noqa: E402

ZONE = "us-central1-a"


@pytest.fixture(scope="module")
def gce():
    with GceEmulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def gcloud(gce, tmp_path_factory):
    home = tmp_path_factory.mktemp("gcloud")
    token = home / "token"
    token.write_text("fm-test-token")
    env = dict(os.environ, CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE=f"{gce.url}/compute/v1/",
               CLOUDSDK_CONFIG=str(home / "config"), CLOUDSDK_CORE_PROJECT=gce.project,
               CLOUDSDK_CORE_DISABLE_PROMPTS="1", CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
               CLOUDSDK_METRICS_ENVIRONMENT="flowmesh-test", CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
               GCE_METADATA_ROOT="127.0.0.1:9", NO_PROXY="127.0.0.1", no_proxy="127.0.0.1",
               **netguard.env(home / "netguard.log"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["gcloud", *args, f"--access-token-file={token}"], env=env, capture_output=True,
                              text=True, timeout=180)
    yield run
    assert netguard.left_loopback(home / "netguard.log") == []   # no gcloud call tried to leave loopback


def _names(gce) -> set[str]:
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1
    client = compute_v1.InstancesClient(credentials=AnonymousCredentials(),
                                        client_options=ClientOptions(api_endpoint=gce.url), transport="rest")
    return {i.name for i in client.list(project=gce.project, zone=ZONE)}


def test_bulk_create_without_async_follows_its_operation_group(gce, gcloud):
    res = gcloud("compute", "instances", "bulk", "create", f"--zone={ZONE}", "--count=2", "--name-pattern=gc-#",
                 "--machine-type=e2-standard-2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "VM instances created: 2, failed: 0" in res.stderr + res.stdout
    res = gcloud("compute", "instances", "bulk", "create", f"--zone={ZONE}", "--predefined-names=gn-a,gn-b",
                 "--machine-type=e2-standard-2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "VM instances created: 2, failed: 0" in res.stderr + res.stdout
    listed = gcloud("compute", "instances", "list", f"--zones={ZONE}", "--format=value(name)")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert {"gc-1", "gc-2", "gn-a", "gn-b"} <= set(listed.stdout.split()) <= _names(gce)   # the same state
    ops = gcloud("compute", "operations", "list", f"--zones={ZONE}", "--format=value(operationType,status)")
    assert ops.returncode == 0, ops.stderr[-2000:]
    kinds = [line.split() for line in ops.stdout.splitlines()]
    assert kinds.count(["bulkInsert", "DONE"]) >= 2 and kinds.count(["insert", "DONE"]) >= 4, kinds


def test_delete_polls_its_operation_to_the_end(gce, gcloud):
    made = gcloud("compute", "instances", "bulk", "create", f"--zone={ZONE}", "--predefined-names=gd-1",
                  "--machine-type=e2-standard-2")
    assert made.returncode == 0, made.stderr[-2000:]
    res = gcloud("compute", "instances", "delete", "gd-1", f"--zone={ZONE}", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "gd-1" not in _names(gce)
    again = gcloud("compute", "instances", "delete", "gd-1", f"--zone={ZONE}", "--quiet")
    assert again.returncode != 0 and "was not found" in again.stderr, again.stderr[-2000:]


def test_a_missing_instance_is_googles_not_found_error_as_gcloud_prints_it(gce, gcloud):
    res = gcloud("compute", "instances", "describe", "no-such", f"--zone={ZONE}")
    assert res.returncode == 1, res.stderr[-2000:]
    # gcloud parsed the JSON error body (a plain-text body makes it print the raw response or crash)
    assert f"The resource 'projects/{gce.project}/zones/{ZONE}/instances/no-such' was not found" in res.stderr
    assert "crashed" not in res.stderr


def test_zones_and_machine_types_as_gcloud_lists_and_describes_them(gce, gcloud):
    res = gcloud("compute", "zones", "list", "--format=value(name,status)")
    assert res.returncode == 0, res.stderr[-2000:]
    assert [line.split() for line in res.stdout.splitlines()] == [[z, "UP"] for z in gce.zones]
    res = gcloud("compute", "machine-types", "describe", "e2-standard-4", f"--zone={ZONE}",
                 "--format=value(name,guestCpus,memoryMb)")
    assert res.returncode == 0 and res.stdout.split() == ["e2-standard-4", "4", "16384"], res.stderr[-2000:]
    res = gcloud("compute", "machine-types", "list", "--filter=name=e2-standard-2", "--format=value(name,zone)")
    assert res.returncode == 0, res.stderr[-2000:]     # the aggregated list, every zone
    assert sorted(line.split()[1] for line in res.stdout.splitlines()) == sorted(gce.zones)
    res = gcloud("compute", "machine-types", "describe", "no-such-type", f"--zone={ZONE}")
    assert res.returncode == 1 and "machineTypes/no-such-type' was not found" in res.stderr, res.stderr[-2000:]


def test_a_multi_zone_list_and_a_multi_name_delete_go_through_the_batch_endpoint(gce, gcloud):
    for zone, names in ((ZONE, "gb-1,gb-2"), ("us-central1-b", "gb-3")):
        made = gcloud("compute", "instances", "bulk", "create", f"--zone={zone}", f"--predefined-names={names}",
                      "--machine-type=e2-standard-2")
        assert made.returncode == 0, made.stderr[-2000:]
    batches = sum(1 for kind, _ in gce.calls if kind == "batch")
    res = gcloud("compute", "instances", "list", f"--zones={ZONE},us-central1-b", "--format=value(name,zone)")
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split() for line in res.stdout.splitlines()]
    assert sorted(r for r in rows if r[0].startswith("gb-")) == [["gb-1", ZONE], ["gb-2", ZONE],
                                                                ["gb-3", "us-central1-b"]]
    res = gcloud("compute", "instances", "delete", "gb-1", "gb-2", f"--zone={ZONE}", "--quiet")
    assert res.returncode == 0, res.stderr[-2000:]
    assert not {"gb-1", "gb-2"} & _names(gce)
    assert sum(1 for kind, _ in gce.calls if kind == "batch") > batches   # they came as batch requests


def test_instances_create_resolves_its_image_family_and_inserts_one_vm(gce, gcloud):
    res = gcloud("compute", "instances", "create", "gi-1", f"--zone={ZONE}", "--machine-type=e2-standard-4",
                 "--image-family=debian-12", "--image-project=debian-cloud", "--labels=flowmesh-pool=p1",
                 "--format=value(name,status)")
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["gi-1", "RUNNING"], res.stdout
    kinds = [kind for kind, _ in gce.calls]
    assert "projectsGet" in kinds and "insert" in kinds and "notServed" not in kinds, gce.calls
    (made,) = [i for i in gce.instances if i["name"] == "gi-1"]
    assert made["machineType"].endswith("/machineTypes/e2-standard-4") and made["labels"] == {"flowmesh-pool": "p1"}
    # gcloud sends the family itself as the boot disk's source image (gcloud 528: an imageFamilyViews
    # link, which Compute Engine resolves); the emulator keeps what it was given (not echoed back:
    # the VM reports an attached disk, as Compute Engine does)
    source = made["_disks"][0]["initializeParams"]["sourceImage"]
    shown = gcloud("compute", "instances", "describe", "gi-1", f"--zone={ZONE}", "--format=json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    disk = json.loads(shown.stdout)["disks"][0]
    assert disk["boot"] and disk["source"].endswith(f"/zones/{ZONE}/disks/gi-1") and "initializeParams" not in disk
    assert {"fingerprint", "labelFingerprint", "cpuPlatform"} <= set(json.loads(shown.stdout))
    sa = gcloud("compute", "instances", "create", "gi-sa", f"--zone={ZONE}", "--machine-type=e2-standard-2",
                "--service-account=fm-sa@p.iam.gserviceaccount.com", "--scopes=cloud-platform", "--can-ip-forward",
                "--format=json")
    assert sa.returncode == 0, sa.stderr[-2000:]
    (described,) = json.loads(sa.stdout)
    assert described["canIpForward"] and described["serviceAccounts"][0]["email"] == "fm-sa@p.iam.gserviceaccount.com"
    assert "/projects/debian-cloud/" in source and source.endswith("/debian-12"), source
    img = gcloud("compute", "images", "describe-from-family", "debian-12", "--project=debian-cloud",
                 "--format=value(name,status)")
    assert img.returncode == 0 and img.stdout.split() == ["debian-12-v20261201", "READY"], img.stderr[-2000:]
    again = gcloud("compute", "instances", "create", "gi-1", f"--zone={ZONE}", "--machine-type=e2-standard-4",
                   "--image-family=debian-12", "--image-project=debian-cloud")
    assert again.returncode == 1 and "already exists" in again.stderr, again.stderr[-2000:]
    bad = gcloud("compute", "instances", "create", "gi-2", f"--zone={ZONE}", "--machine-type=e9-huge",
                 "--image-family=debian-12", "--image-project=debian-cloud")
    assert bad.returncode == 1 and "e9-huge" in bad.stderr, bad.stderr[-2000:]
    assert "gi-2" not in _names(gce)
