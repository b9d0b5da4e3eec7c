"""The real redis-server for the shared-fleet tests: one per test module on a free
loopback port in a temp dir (flowmesh_sdk.control.redis.localserver), killed after."""

from __future__ import annotations

import shutil

import pytest

from flowmesh_sdk.control.redis.localserver import LocalRedis


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is missing: apt-get install -y redis-server (bash setup.sh --dev)")
    # AOF with fsync always: a SIGKILLed Redis comes back with every write it answered for
    srv = LocalRedis(tmp_path_factory.mktemp("redis")).start()
    try:
        yield srv
    finally:
        srv.stop()
