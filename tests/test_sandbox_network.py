"""Egress policies through the public API on real podman: ``network="none"`` (default),
``"all"`` and allow-lists of host:port / CIDR entries enforced from the host with nftables
in the sandbox's network namespace.  The test servers listen on the podman bridge's
gateway address (this host's side of the bridge), so no traffic leaves the machine.
Issue 13."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import subprocess
import threading

import pytest

from flowmesh_sdk import Fleet, InstanceSpec, PoolSpec, SandboxSpec, SpecError
from flowmesh_sdk.identity import sandbox_h_exec


@pytest.fixture(scope="module")
async def pool(tmp_path_factory, busybox_image, swe_image):
    from flowmesh_providers.local import LocalProvider

    home = tmp_path_factory.mktemp("fmhome-network")
    provider = LocalProvider(cpus=2, memory_gb=8, state_dir=home / "local" / "instances")
    fleet = Fleet("network", home=home, providers={"local": provider})
    p = await fleet.pool(PoolSpec(name="net", instance=InstanceSpec(cpus=2, memory_gb=4),
                                  min_instances=1, max_instances=1, sandboxes_per_instance=3,
                                  warm_per_image=0))
    yield p
    await fleet.close(timeout_s=30)


def _gateway() -> str:
    out = subprocess.run(["podman", "network", "inspect", "podman"], check=True,
                         capture_output=True, text=True).stdout
    net = json.loads(out)[0]
    subnets = net.get("subnets") or net.get("Subnets") or []
    if subnets:
        return subnets[0]["gateway"]
    # CNI style (podman 3): plugins[0].ipam.ranges[0][0].gateway
    return net["plugins"][0]["ipam"]["ranges"][0][0]["gateway"]


@contextlib.contextmanager
def _server(addr: str, word: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = word.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer((addr, 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


async def _get(sb, addr: str, port: int) -> str:
    """The body a GET returns, or '' (busybox nc; its wget crashes on this image)."""
    r = await sb.exec(f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {addr} {port} 2>&1", timeout_s=20)
    head, sep, body = r.stdout.partition("\r\n\r\n")
    return body if sep and head.startswith("HTTP/1.") else ""


def test_policy_values_and_identity():
    img = "localhost/flowmesh/busybox:1"
    assert SandboxSpec(image=img).network is False
    assert SandboxSpec(image=img, network="none").network is False
    assert SandboxSpec(image=img, network="all").network is True
    spec = SandboxSpec(image=img, network=("10.88.0.1:80", "10.0.0.0/8", "10.88.0.1:80", "[::1]:443"))
    assert spec.network == ("10.0.0.0/8", "10.88.0.1:80", "[::1]:443")
    d = "sha256:" + "0" * 64
    same = SandboxSpec(image=img, network=["[::1]:443", "10.0.0.0/8", "10.88.0.1:80"])
    assert sandbox_h_exec(spec, d) == sandbox_h_exec(same, d)
    assert sandbox_h_exec(spec, d) != sandbox_h_exec(SandboxSpec(image=img, network=True), d)
    assert sandbox_h_exec(SandboxSpec(image=img, network="none"), d) == \
        sandbox_h_exec(SandboxSpec(image=img, network=False), d)
    for bad in ("some", ("10.0.0.1",), ("10.0.0.1:0",), ("bad host:1",), 3):
        with pytest.raises(SpecError, match="sandbox.network"):
            SandboxSpec(image=img, network=bad)


async def test_allow_list_reachability_both_ways(pool, busybox_image):
    spec = dict(image=busybox_image, cpus=0.5, memory_gb=0.25)
    # a sandbox with the bridge network up first, so its gateway address is on this host
    async with pool.sandbox(SandboxSpec(**spec, network="all")) as everything:
        gw = _gateway()
        with _server(gw, "allowed") as p_ok, _server(gw, "denied") as p_no:
            assert await _get(everything, gw, p_ok) == "allowed"
            assert await _get(everything, gw, p_no) == "denied"
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}:{p_ok}",))) as listed, \
                    pool.sandbox(SandboxSpec(**spec)) as none:
                assert await _get(listed, gw, p_ok) == "allowed"
                assert await _get(listed, gw, p_no) == ""
                # the metadata address stays unreachable, listed or not
                r = await listed.exec("nc -w 5 169.254.169.254 80 </dev/null 2>&1; echo rc=$?", timeout_s=20)
                assert "rc=0" not in r.stdout, r
                # the sandbox cannot lift the policy (no CAP_NET_ADMIN, no nft)
                r = await listed.exec("ip route del unreachable 169.254.0.0/16 2>&1; echo rc=$?")
                assert "rc=0" not in r.stdout
                assert await _get(none, gw, p_ok) == ""
                # loopback inside the sandbox always works
                await listed.write_file("/srv/index.html", "local\n")
                srv = await listed.start("exec httpd -f -p 127.0.0.1:8081 -h /srv")
                for _ in range(50):
                    if body := await _get(listed, "127.0.0.1", 8081):
                        break
                    await asyncio.sleep(0.1)
                assert body == "local\n", body
                await srv.kill()
            # a CIDR entry admits every port of its addresses
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}/32",))) as cidr:
                assert await _get(cidr, gw, p_ok) == "allowed"
                assert await _get(cidr, gw, p_no) == "denied"


async def _bash_get(sb, addr: str, port: int) -> str:
    """The body a GET returns through bash's /dev/tcp, or '' (the Debian image has no nc)."""
    r = await sb.exec(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port} && "
                      f"printf \"GET / HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3' 2>&1", timeout_s=20)
    head, sep, body = r.stdout.partition("\r\n\r\n")
    return body if sep and head.startswith("HTTP/1.") else ""


async def test_allow_list_on_a_bash_image(pool, swe_image):
    spec = dict(image=swe_image, cpus=0.5, memory_gb=0.25)
    async with pool.sandbox(SandboxSpec(**spec, network="all")) as everything:
        gw = _gateway()
        with _server(gw, "allowed") as p_ok, _server(gw, "denied") as p_no:
            assert await _bash_get(everything, gw, p_no) == "denied"
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}:{p_ok}",))) as listed:
                assert await _bash_get(listed, gw, p_ok) == "allowed"
                assert await _bash_get(listed, gw, p_no) == ""
                r = await listed.exec("timeout 5 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80' 2>&1; "
                                      "echo rc=$?", timeout_s=20)
                assert "rc=0" not in r.stdout, r
