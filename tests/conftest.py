"""Shared fixtures.  Everything here is real: podman (runc), the images built from
Debian packages by flowmesh_sdk.imagebuild, the local provider on this host."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_images_module():
    from flowmesh_sdk.imagebuild import build   # the project's images (flowmesh_sdk/imagebuild)
    return build


def pytest_configure(config: pytest.Config) -> None:
    if shutil.which("podman") is None:
        raise pytest.UsageError("the tests use the real podman: apt-get install -y podman runc")
    # the session-end leak check (tests/_leakcheck.py): tags the session before anything starts
    config.pluginmanager.import_plugin("_leakcheck")


@pytest.fixture(scope="session")
def images_mod():
    return _load_images_module()


@pytest.fixture(scope="session")
def busybox_image(images_mod) -> str:
    return images_mod.build_busybox()


@pytest.fixture(scope="session")
def swe_image(images_mod) -> str:
    return images_mod.build_swe_base()


@pytest.fixture
def fm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "fmhome"
    home.mkdir()
    monkeypatch.setenv("FLOWMESH_HOME", str(home))
    return home


def podman_names(label: str) -> list[str]:
    out = subprocess.run(["podman", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
                         check=True, capture_output=True, text=True).stdout
    return [n for n in out.split() if n]


@pytest.fixture(scope="module")
async def snapshot_registry():
    """A LocalRegistry for ``Sandbox.snapshot()`` (a module's tests share it); the images the
    forks pulled from it go with it."""
    from flowmesh_sdk.registry.local import LocalRegistry

    async with LocalRegistry() as reg:
        host = reg.host
        yield reg
    listed = subprocess.run(["podman", "images", "--format", "{{.ID}} {{.Repository}}"],
                            capture_output=True, text=True, check=True).stdout.split("\n")
    ids = {line.split()[0] for line in listed if f" {host}/" in line}
    if ids:
        subprocess.run(["podman", "rmi", "-f", *ids], capture_output=True, check=False)


@contextlib.asynccontextmanager
async def local_pool(home: Path, name: str, *, sandboxes_per_instance: int = 2, runtime_config=None,
                     **pool_fields):
    """A persistent pool ``name`` of one 2-cpu instance on a fixed 2-cpu, 8 GB local host in
    ``home`` (a module's sandboxes share it); yields ``(fleet, pool)`` and closes the fleet."""
    from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec
    from flowmesh_providers.local import LocalProvider

    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local" / "instances",
                             runtime_config=runtime_config)
    fleet = Fleet(name, home=home, providers={"local": provider}, runtime_config=runtime_config)
    try:
        pool = await fleet.pool(PoolSpec(name=name, instance=InstanceSpec(cpus=2, memory_gb=4), min_instances=1,
                                         max_instances=1, sandboxes_per_instance=sandboxes_per_instance,
                                         **pool_fields))
        yield fleet, pool
    finally:
        await fleet.close(timeout_s=30)


@pytest.fixture
async def fleet(fm_home: Path):
    from flowmesh_sdk import Fleet
    from flowmesh_providers.local import LocalProvider

    # A fixed 2-cpu, 8 GB host so capacity tests mean the same on every machine.
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=fm_home / "local" / "instances")
    f = Fleet("test", home=fm_home, providers={"local": provider})
    yield f
    await f.close(timeout_s=30)
    left = [n for n in podman_names(f"flowmesh.owner={f.owner}")]
    assert not left, f"containers left behind: {left}"


_AWS_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
            "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
            "FLOWMESH_EC2_AMI", "FLOWMESH_EC2_ENDPOINT_URL",
            # Google and Azure credentials (the gce and azure providers): tests use emulators only
            "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CONFIG", "FLOWMESH_GCE_PROJECT",
            "FLOWMESH_GCE_ENDPOINT", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID",
            "AZURE_SUBSCRIPTION_ID", "AZURE_FEDERATED_TOKEN_FILE", "FLOWMESH_AZURE_ENDPOINT")


@pytest.fixture
def recording_runner():
    """A local runner that records each command it runs (``.calls``): how many round trips
    an operation would cost on a remote machine."""
    from flowmesh_sdk.remote.local import LocalRunner

    class RecordingRunner(LocalRunner):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[list[str]] = []

        async def run(self, argv, **kw):
            self.calls.append(list(argv))
            return await super().run(argv, **kw)

    return RecordingRunner()


@pytest.fixture
def no_real_cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real credentials, no IMDS, no shared AWS config: nothing can reach a cloud."""
    for name in _AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # google-auth would probe the GCE metadata server (169.254.169.254) for credentials: a
    # refused loopback port instead
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))


@pytest.fixture(autouse=True, scope="session")
def _no_proxy_env():
    # Tests only talk to 127.0.0.0/8.
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    yield


@pytest.fixture(autouse=True)
def _flowmesh_logging_restored():
    """A test that runs the CLI in process (``main([...])``) sets the ``flowmesh`` logger's
    level and handler as a CLI process would; later tests' ``caplog`` must not inherit that."""
    lg = logging.getLogger("flowmesh")
    level, handlers = lg.level, list(lg.handlers)
    yield
    lg.setLevel(level)
    lg.handlers[:] = handlers
