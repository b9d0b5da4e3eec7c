"""Fixtures of the k8s provider's test modules, on the module's Kubernetes API emulator
(``k8s_emulator`` in conftest.py): the emulator, the image its kubelet pulls, and a
provider through a kubeconfig of its own that deletes every pod it left."""

from __future__ import annotations

import pytest

from flowmesh_sdk import InstanceSpec

SPEC = InstanceSpec(cpus=1, memory_gb=1)


@pytest.fixture
def emu(k8s_emulator):
    return k8s_emulator[0]


@pytest.fixture
def image(k8s_emulator):
    return k8s_emulator[1]


@pytest.fixture
async def prov(emu, tmp_path):
    from flowmesh_providers.k8s import K8sProvider
    p = K8sProvider(kubeconfig=str(emu.kubeconfig(tmp_path / "kubeconfig")), schedule_timeout_s=10)
    yield p
    await p.terminate([i.id for i in await p.list_tagged({})])
    await p.close()
