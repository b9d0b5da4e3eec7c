"""Egress policies through the public API on real podman: ``network="none"`` (default),
``"all"`` and allow-lists of host:port / CIDR entries enforced from the host with nftables
in the sandbox's network namespace.  The test servers listen on the podman bridge's
gateway address (this host's side of the bridge), so no traffic leaves the machine.
Issue 13."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess

import pytest
from _netcheck import gateway, http_server, nc_get

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
        gw = gateway()
        with http_server(gw, "allowed") as p_ok, http_server(gw, "denied") as p_no:
            assert await nc_get(everything, gw, p_ok) == "allowed"
            assert await nc_get(everything, gw, p_no) == "denied"
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}:{p_ok}",))) as listed, \
                    pool.sandbox(SandboxSpec(**spec)) as none:
                assert await nc_get(listed, gw, p_ok) == "allowed"
                assert await nc_get(listed, gw, p_no) == ""
                # the metadata address stays unreachable, listed or not
                r = await listed.exec("nc -w 5 169.254.169.254 80 </dev/null 2>&1; echo rc=$?", timeout_s=20)
                assert "rc=0" not in r.stdout, r
                # the sandbox cannot lift the policy (no CAP_NET_ADMIN, no nft)
                r = await listed.exec("ip route del unreachable 169.254.0.0/16 2>&1; echo rc=$?")
                assert "rc=0" not in r.stdout
                assert await nc_get(none, gw, p_ok) == ""
                # loopback inside the sandbox always works
                await listed.write_file("/srv/index.html", "local\n")
                srv = await listed.start("exec httpd -f -p 127.0.0.1:8081 -h /srv")
                for _ in range(50):
                    if body := await nc_get(listed, "127.0.0.1", 8081):
                        break
                    await asyncio.sleep(0.1)
                assert body == "local\n", body
                await srv.kill()
            # a CIDR entry admits every port of its addresses
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}/32",))) as cidr:
                assert await nc_get(cidr, gw, p_ok) == "allowed"
                assert await nc_get(cidr, gw, p_no) == "denied"


async def _bash_get(sb, addr: str, port: int) -> str:
    """The body a GET returns through bash's /dev/tcp, or '' (the Debian image has no nc)."""
    r = await sb.exec(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port} && "
                      f"printf \"GET / HTTP/1.0\\r\\n\\r\\n\" >&3 && cat <&3' 2>&1", timeout_s=20)
    head, sep, body = r.stdout.partition("\r\n\r\n")
    return body if sep and head.startswith("HTTP/1.") else ""


async def test_allow_list_on_a_bash_image(pool, swe_image):
    spec = dict(image=swe_image, cpus=0.5, memory_gb=0.25)
    async with pool.sandbox(SandboxSpec(**spec, network="all")) as everything:
        gw = gateway()
        with http_server(gw, "allowed") as p_ok, http_server(gw, "denied") as p_no:
            assert await _bash_get(everything, gw, p_no) == "denied"
            async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}:{p_ok}",))) as listed:
                assert await _bash_get(listed, gw, p_ok) == "allowed"
                assert await _bash_get(listed, gw, p_no) == ""
                r = await listed.exec("timeout 5 bash -c 'exec 3<>/dev/tcp/169.254.169.254/80' 2>&1; "
                                      "echo rc=$?", timeout_s=20)
                assert "rc=0" not in r.stdout, r


# Connects from inside the sandbox to each target in /tmp/targets.json ({name: [addr,
# port, "tcp"|"udp"]}) TRIES times; prints {name: [[errno name or "ok", seconds], ...]}.
_PROBE = r"""
import errno, json, socket, sys, time
targets, tries = json.load(open("/tmp/targets.json")), int(sys.argv[1])
out = {}
for name, (addr, port, kind) in targets.items():
    rows = []
    for _ in range(tries):
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
        s.settimeout(5)
        t = time.monotonic()
        try:
            if kind == "tcp":
                s.connect((addr, port))
            else:
                s.sendto(b"x", (addr, port))
            got = "ok"
        except socket.timeout:
            got = "timeout"
        except OSError as exc:
            got = errno.errorcode.get(exc.errno, str(exc.errno))
        rows.append((got, time.monotonic() - t))
        s.close()
    out[name] = rows
print(json.dumps(out))
"""


async def test_refused_egress_fails_at_once(pool, swe_image):
    """A destination an allow-list refuses fails at once: TCP with a reset (connection
    refused), never the second a SYN answered only by an ICMP error can wait; UDP at the
    send.  The metadata address stays refused, the listed destination still answers, and
    nothing refused reaches the host's listeners (issue 24)."""
    import socket

    spec = dict(image=swe_image, cpus=0.5, memory_gb=0.25)
    async with pool.sandbox(SandboxSpec(**spec, network="all")) as everything:
        gw = gateway()
        with contextlib.ExitStack() as stack:
            lst = stack.enter_context(socket.socket())
            lst.bind((gw, 0))
            lst.listen(64)
            udp = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            udp.bind((gw, 0))
            spare = stack.enter_context(socket.socket())
            spare.bind((gw, 0))
            p_closed = spare.getsockname()[1]
            spare.close()                                         # nothing listens there
            # the refused listener does answer a sandbox that may reach it
            r = await everything.exec(f"timeout 5 bash -c 'exec 3<>/dev/tcp/{gw}/{lst.getsockname()[1]}'; "
                                      "echo rc=$?", timeout_s=20)
            assert "rc=0" in r.stdout, r
            lst.settimeout(5)
            lst.accept()[0].close()
            lst.setblocking(False)
            udp.setblocking(False)
            with http_server(gw, "allowed") as p_ok:
                async with pool.sandbox(SandboxSpec(**spec, network=(f"{gw}:{p_ok}",))) as listed:
                    await listed.write_file("/tmp/probe.py", _PROBE)
                    await listed.write_file("/tmp/targets.json", json.dumps({
                        "listening": [gw, lst.getsockname()[1], "tcp"], "closed": [gw, p_closed, "tcp"],
                        "metadata": ["169.254.169.254", 80, "tcp"],
                        "udp": [gw, udp.getsockname()[1], "udp"], "allowed": [gw, p_ok, "tcp"]}))
                    r = await listed.exec("python3 /tmp/probe.py 40", timeout_s=120)
                    assert r.exit_code == 0, r
                    assert await _bash_get(listed, gw, p_ok) == "allowed"
            reached = []
            for sock in (lst, udp):
                with contextlib.suppress(BlockingIOError):
                    reached.append(repr(sock.accept() if sock is lst else sock.recvfrom(64)))
    got = json.loads(r.stdout)
    assert {e for e, _ in got["allowed"]} == {"ok"}, got["allowed"]
    for name in ("listening", "closed"):
        assert {e for e, _ in got[name]} == {"ECONNREFUSED"}, (name, got[name])
    # the metadata route answers first (unreachable); refused either way, never connected
    assert {e for e, _ in got["metadata"]} <= {"ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH"}, got
    assert {e for e, _ in got["udp"]} == {"EPERM"}, got["udp"]        # refused at the send
    assert not reached, reached                                        # no connection, no datagram
    slowest = {name: max(s for _, s in rows) for name, rows in got.items() if name != "allowed"}
    assert all(s < 0.5 for s in slowest.values()), slowest             # the one timing bound


_NETNS = r"""
set -e
ip link set lo up
ip link add va type veth peer name vb
ip link set va up; ip link set vb up
ip addr add 192.0.2.1/24 dev va; ip addr add 2001:db8::1/64 dev va nodad
ip route add default dev va; ip -6 route add default dev va
nft -f "$1"
exec "$2" "$3" 5
"""


def test_egress_ruleset_refuses_ipv4_and_ipv6_at_once(tmp_path):
    """The allow-list's nftables table, loaded into a network namespace of the test's own
    (a veth pair and nothing else: no packet can leave it) with IPv4 and IPv6 routes and no
    metadata route: TCP to a refused address of either family is reset at once, the
    metadata addresses too, UDP fails at the send, and a listed address is let through (no
    one answers it there: its connect waits, and fails once the neighbour lookup gives up)
    (issue 24)."""
    import shutil
    import sys

    from flowmesh_sdk.remote.runtime import RuntimeConfig
    from flowmesh_sdk.remote.runtime_network import egress_ruleset

    if not (shutil.which("unshare") and shutil.which("nft") and shutil.which("ip")):
        pytest.skip("needs unshare, ip and nft")
    allow = ("192.0.2.2:8080", "[2001:db8::2]:8080")
    (tmp_path / "rules.nft").write_text(egress_ruleset(allow, {}, RuntimeConfig().metadata_networks))
    probe = _PROBE.replace('"/tmp/targets.json"', repr(str(tmp_path / "targets.json")))
    (tmp_path / "probe.py").write_text(probe.replace("s.settimeout(5)", "s.settimeout(0.7)"))
    (tmp_path / "targets.json").write_text(json.dumps({
        "v4": ["192.0.2.2", 80, "tcp"], "v4-far": ["198.51.100.7", 443, "tcp"],
        "v6": ["2001:db8::2", 80, "tcp"], "v6-far": ["2001:db8:1::7", 443, "tcp"],
        "metadata-v4": ["169.254.169.254", 80, "tcp"], "metadata-v6": ["fd00:ec2::254", 80, "tcp"],
        "udp-v4": ["192.0.2.2", 53, "udp"], "udp-v6": ["2001:db8::2", 53, "udp"],
        "listed-v4": ["192.0.2.2", 8080, "tcp"], "listed-v6": ["2001:db8::2", 8080, "tcp"]}))
    res = subprocess.run(["unshare", "--net", "sh", "-c", _NETNS, "sh", str(tmp_path / "rules.nft"),
                          sys.executable, str(tmp_path / "probe.py")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    for name in ("v4", "v4-far", "v6", "v6-far", "metadata-v4", "metadata-v6"):
        assert {e for e, _ in got[name]} == {"ECONNREFUSED"}, (name, got[name])
        assert max(s for _, s in got[name]) < 0.5, (name, got[name])
    for name in ("udp-v4", "udp-v6"):
        assert {e for e, _ in got[name]} == {"EPERM"}, (name, got[name])
    for name in ("listed-v4", "listed-v6"):   # let out: a wait, then no neighbour answers
        assert got[name][0][0] == "timeout", (name, got[name])
        assert {e for e, _ in got[name]} <= {"timeout", "EHOSTUNREACH"}, (name, got[name])
