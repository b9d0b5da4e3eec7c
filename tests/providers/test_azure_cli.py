"""The ARM emulator checked by a client nobody here wrote: Microsoft's own ``az`` (azure-cli
from PyPI, in ``.venv-az``; issue 30).  The emulator serves HTTPS on 127.0.0.1 with a
self-signed certificate (``REQUESTS_CA_BUNDLE``: azure-core sends a bearer token over TLS
only), registered as a cloud from its own ``/metadata/endpoints`` (``az cloud register
--endpoint-resource-manager``), logged into as a service principal of its AD FS-style
authority.  Then ``az group``, ``az vm create`` (a template deployment: vnet, NIC, VM),
``az vm list/show/delete`` and ARM's error bodies, each compared with what the official
Python client or the SDK's provider sees, and the reverse.  Every az process runs under the
network guard (tests/_netguard): a lookup or connection outside 127.0.0.0/8 is refused and
logged, and each test asserts the log is empty."""

from __future__ import annotations

import base64
import datetime
import functools
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import _netguard as netguard
import pytest

from flowmesh_sdk import InstanceSpec
from flowmesh_sdk.provider import TAG_FLEET, TAG_OWNER, TAG_POOL, LaunchRequest

pytest.importorskip("azure.mgmt.compute")

ROOT = Path(__file__).resolve().parents[2]
AZ = str(ROOT / ".venv-az" / "bin" / "az") if (ROOT / ".venv-az" / "bin" / "az").exists() else shutil.which("az")
pytestmark = pytest.mark.skipif(AZ is None, reason="needs az (setup.sh --dev installs azure-cli into .venv-az)")

from flowmesh_sdk.testing.azure import AzureEmulator  # noqa: E402

RG = "rg-cli"
CLOUD_INIT = "#cloud-config\nruncmd:\n  - [touch, /tmp/made-by-az]\n"


@pytest.fixture(scope="module")
def emu():
    with AzureEmulator(tls=True) as e:
        yield e


@functools.cache
def _az_version() -> str:
    python = Path(AZ or "").resolve().parent / "python3"
    return subprocess.run([str(python), "-c", "import azure.cli.core as c; print(c.__version__)"], check=True,
                          capture_output=True, text=True).stdout.strip()


class Az:
    """``az`` with a throw-away config directory, under the network guard."""

    def __init__(self, emu: AzureEmulator, home: Path) -> None:
        self.emu, self.home = emu, home
        self.guard_log = home / "netguard.log"
        self.env = dict(os.environ, AZURE_CONFIG_DIR=str(home / "config"), REQUESTS_CA_BUNDLE=str(emu.ca_cert),
                        AZURE_CORE_COLLECT_TELEMETRY="false", AZURE_CORE_SURVEY_MESSAGE="false",
                        AZURE_CORE_NO_COLOR="true", AZURE_CORE_ONLY_SHOW_ERRORS="true",
                        NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost", **netguard.env(self.guard_log))

        # az's own version check (azcliprod.blob.core.windows.net) on a fresh config: answered from
        # a cache that says today's check found this version
        (home / "config").mkdir(parents=True, exist_ok=True)
        version = {"local": _az_version()}
        (home / "config" / "versionCheck.json").write_text(json.dumps(
            {"versions": {"azure-cli": version, "core": version}, "update_time": str(datetime.datetime.now())}))

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert AZ is not None
        return subprocess.run([AZ, *args], env=self.env, capture_output=True, text=True, timeout=240,
                              stdin=subprocess.DEVNULL)   # az reads a piped stdin

    def json(self, *args: str) -> object:
        res = self(*args, "-o", "json")
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout)

    def login(self, secret: str | None = None) -> subprocess.CompletedProcess[str]:
        reg = self("cloud", "register", "-n", "FlowMeshEmulator", "--endpoint-resource-manager", self.emu.url,
                   "-o", "none")
        assert reg.returncode == 0, reg.stderr[-3000:]
        chosen = self("cloud", "set", "-n", "FlowMeshEmulator")
        assert chosen.returncode == 0, chosen.stderr[-3000:]
        d = self.emu.directory
        return self("login", "--service-principal", "-u", d.client_id, f"--password={secret or d.client_secret}",
                    "--tenant", d.tenant_id, "-o", "none")

    def left_loopback(self) -> list[str]:
        return netguard.left_loopback(self.guard_log)


@pytest.fixture
def az(emu, tmp_path):
    cli = Az(emu, tmp_path)
    res = cli.login()
    assert res.returncode == 0, res.stderr[-3000:]
    made = cli("group", "create", "-n", RG, "-l", "eastus", "-o", "none")
    assert made.returncode == 0, made.stderr[-3000:]
    yield cli
    assert cli.left_loopback() == []


def _compute(emu: AzureEmulator):
    from azure.mgmt.compute import ComputeManagementClient
    return ComputeManagementClient(emu.credential(), emu.subscription, base_url=emu.url,
                                   connection_verify=str(emu.ca_cert))


def test_az_registers_the_emulator_from_its_metadata_and_logs_in_as_a_service_principal(emu, tmp_path):
    cli = Az(emu, tmp_path)
    assert cli.login().returncode == 0
    cloud = cli.json("cloud", "show")
    assert cloud["endpoints"]["activeDirectory"] == f"{emu.url}/adfs"          # discovered, not given
    assert cloud["endpoints"]["vmImageAliasDoc"].startswith(emu.url)
    account = cli.json("account", "show")
    assert account["id"] == emu.subscription and account["tenantId"] == emu.directory.tenant_id
    assert account["user"] == {"name": emu.directory.client_id, "type": "servicePrincipal"}
    wrong = Az(emu, tmp_path / "wrong")
    res = wrong.login(secret="not-the-secret")
    assert res.returncode != 0 and "its secret is wrong" in res.stderr, res.stderr[-3000:]   # the OAuth error
    assert cli.left_loopback() == [] and wrong.left_loopback() == []


def test_vm_create_with_the_providers_options_deploys_what_the_official_client_reads(emu, az, tmp_path):
    key = tmp_path / "id.pub"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True)
    (tmp_path / "cloud-init.yaml").write_text(CLOUD_INIT)
    out = az.json("vm", "create", "-g", RG, "-n", "vm-az", "--image", "Ubuntu2204", "--size", "Standard_D2s_v5",
                  "--admin-username", "flowmesh", "--ssh-key-values", str(key),
                  "--custom-data", str(tmp_path / "cloud-init.yaml"), "--priority", "Spot",
                  "--eviction-policy", "Delete", "--max-price", "-1", "--public-ip-address", "", "--nsg", "",
                  "--os-disk-delete-option", "Delete", "--nic-delete-option", "Delete",
                  "--storage-sku", "Premium_LRS", "--os-disk-size-gb", "30", "--tags", "flowmesh-pool=cli")
    assert out["powerState"] == "VM running" and out["privateIpAddress"].startswith("10.20.")
    vm = _compute(emu).virtual_machines.get(RG, "vm-az")
    assert vm.hardware_profile.vm_size == "Standard_D2s_v5" and vm.priority == "Spot"
    assert vm.eviction_policy == "Delete" and vm.tags == {"flowmesh-pool": "cli"}
    assert vm.storage_profile.image_reference.offer == "0001-com-ubuntu-server-jammy"
    assert vm.os_profile.linux_configuration.ssh.public_keys[0].key_data.strip() == key.read_text().strip()
    assert emu.custom_data(vm.vm_id) == base64.b64encode(CLOUD_INIT.encode()).decode()   # kept, never returned
    assert vm.os_profile.custom_data is None
    listed = az.json("vm", "list", "-g", RG, "--query", "[].name")
    assert "vm-az" in listed and "vm-az" in az.json("vm", "list", "--query", "[].name")   # subscription-wide
    shown = az.json("vm", "show", "-g", RG, "-n", "vm-az", "-d")
    assert shown["powerState"] == "VM running" and shown["privateIps"] == out["privateIpAddress"]
    res = az("vm", "delete", "-g", RG, "-n", "vm-az", "--yes")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "vm-az" not in [v.name for v in _compute(emu).virtual_machines.list(RG)]
    assert "vm-azVMNic" not in az.json("network", "nic", "list", "-g", RG, "--query", "[].name")   # deleteOption


async def test_what_the_provider_launches_az_lists_and_az_deletes(emu, az, monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(emu.ca_cert))   # the provider's azure-core client, over TLS
    prov = emu.provider(operation_timeout_s=10)
    try:
        spec = InstanceSpec(cpus=2, memory_gb=4)
        offer = next(o for o in await prov.offers(spec) if o.instance_type == "Standard_D2s_v5" and not o.spot)
        fleet = f"cli-{uuid.uuid4().hex[:6]}"
        [inst] = await prov.launch(LaunchRequest(offer=offer, spec=spec, count=1, request_id=f"r-{fleet}",
                                                 tags={TAG_FLEET: fleet, TAG_POOL: "p", TAG_OWNER: "tests"}))
        rows = az.json("vm", "list", "-g", prov.resource_group, "--query", "[].{name:name, tags:tags, id:vmId}")
        mine = [r for r in rows if r["tags"].get(TAG_FLEET) == fleet]
        assert [r["id"] for r in mine] == [inst.id]          # the VM the provider made, with its tags
        shown = az.json("vm", "show", "-g", prov.resource_group, "-n", mine[0]["name"], "-d")
        assert shown["hardwareProfile"]["vmSize"] == "Standard_D2s_v5" and shown["powerState"] == "VM running"
        res = az("vm", "delete", "-g", prov.resource_group, "-n", mine[0]["name"], "--yes")
        assert res.returncode == 0, res.stderr[-3000:]
        assert [i.id for i in await prov.list_tagged({TAG_FLEET: fleet})] == []
    finally:
        await prov.terminate([i.id for i in await prov.list_tagged({})])
        await prov.close()


def test_arm_errors_as_az_prints_them(emu, az, tmp_path):
    res = az("vm", "show", "-g", RG, "-n", "no-such")
    assert res.returncode != 0 and "(ResourceNotFound)" in res.stderr, res.stderr[-3000:]
    res = az("vm", "show", "-g", "no-such-group", "-n", "x")
    assert res.returncode != 0 and "(ResourceGroupNotFound)" in res.stderr, res.stderr[-3000:]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True)
    base = ("vm", "create", "-g", RG, "--image", "Ubuntu2204", "--admin-username", "flowmesh",
            "--ssh-key-values", str(tmp_path / "id.pub"), "--public-ip-address", "", "--nsg", "")
    res = az(*base, "-n", "vm-bad", "--size", "Standard_Bogus")
    assert res.returncode != 0, res.stderr[-3000:]
    assert "DeploymentFailed" in res.stderr and "SkuNotAvailable" in res.stderr and "Standard_Bogus" in res.stderr
    emu.set_core_quota("eastus", 1)
    try:
        res = az(*base, "-n", "vm-quota", "--size", "Standard_D2s_v5")
    finally:
        emu.set_core_quota("eastus", None)
    assert res.returncode != 0 and "OperationNotAllowed" in res.stderr and "Cores quota" in res.stderr


def test_group_delete_takes_what_is_in_it(emu, az, tmp_path):
    assert RG in az.json("group", "list", "--query", "[].name")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id")], check=True)
    made = az("vm", "create", "-g", RG, "-n", "vm-in-group", "--image", "Ubuntu2204", "--size", "Standard_F2s_v2",
              "--admin-username", "flowmesh", "--ssh-key-values", str(tmp_path / "id.pub"),
              "--public-ip-address", "", "--nsg", "", "-o", "none")
    assert made.returncode == 0, made.stderr[-3000:]
    res = az("group", "delete", "-n", RG, "--yes")
    assert res.returncode == 0, res.stderr[-3000:]
    assert RG not in az.json("group", "list", "--query", "[].name")
    assert "vm-in-group" not in az.json("vm", "list", "--query", "[].name")
