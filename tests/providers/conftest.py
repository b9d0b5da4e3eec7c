"""Provider environments for the conformance suite: each provider's folder has one
(``conformance.py``, named by its descriptor's ``conformance``) that yields a ready
provider, the offer to launch, and the means to provoke its capacity error
(:mod:`flowmesh_sdk.testing.conformance`).  A new provider is tested by having one; the
suite's shared emulators are the session fixtures here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import _plugins
from flowmesh_sdk import backends
from flowmesh_sdk.descriptor import load_ref
from flowmesh_sdk.testing.conformance import ConformanceEnv


@pytest.fixture(autouse=True)
def _no_real_cloud(no_real_cloud) -> None:
    """Every provider test runs away from real clouds (see tests/conftest.py)."""


ProviderEnv = ConformanceEnv   # the name this suite used before the environments moved


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


#: every installed provider whose descriptor names a conformance environment, and the
#: provider packages defined only in the tests (tests/plugins), installed for their run
PLUGINS = _plugins.names()
ENVIRONMENTS = sorted({n for n, d in backends.descriptors().items() if d.conformance} | set(PLUGINS))


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


@pytest.fixture(scope="module")
def k8s_emulator(busybox_image):
    """The Kubernetes API emulator, an image its kubelet pulls from a local registry, and
    that registry; one per module, so its registry process and pods are gone before later
    modules run (tests/test_suite_hygiene.py counts a live process of this session as
    another session's)."""
    pytest.importorskip("kubernetes")
    from flowmesh_sdk.registry.local import LocalRegistry
    from flowmesh_sdk.testing.k8s import KubeEmulator
    with LocalRegistry() as reg, KubeEmulator() as emu:
        yield emu, reg.push(busybox_image, "flowmesh/busybox:k8s"), reg


@pytest.fixture(scope="session")
def byo_sshd():
    pytest.importorskip("paramiko")
    from flowmesh_sdk.testing.sshd import LoopbackSshd
    with LoopbackSshd("127.0.0.5") as d:
        yield d


@pytest.fixture(params=ENVIRONMENTS)
async def env(request, tmp_path: Path) -> AsyncIterator[ConformanceEnv]:
    """The provider's own environment (its folder's conformance.py, named by its descriptor)."""
    with _plugins.installed() if request.param in PLUGINS else contextlib.nullcontext():
        ref = backends.descriptor(request.param).conformance
        assert ref is not None
        async with load_ref(ref, "conformance")(tmp_path, request.getfixturevalue) as e:
            yield e
