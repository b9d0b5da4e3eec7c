"""The registry test fixtures against the real thing: Debian's docker-registry
(distribution v2.8) on 127.0.0.1, podman pushing and pulling, the token server, the
fault-injecting proxy."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from flowmesh_sdk.testing.proxy import FaultProxy
from flowmesh_sdk.registry.local import (LocalRegistry, LocalRegistryError, RegistryNotInstalled,
                                           parse_challenge)
from flowmesh_sdk.testing.tokenserver import TokenServer

pytestmark = pytest.mark.timeout(120)

NAME_TAG = "flowmesh/busybox:1"
MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
])

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(method: str, url: str, headers: dict[str, str] | None = None,
         data: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


_RUNROOTS: set[Path] = set()


@pytest.fixture(autouse=True)
def _remove_runroots():
    yield
    while _RUNROOTS:
        shutil.rmtree(_RUNROOTS.pop(), ignore_errors=True)


def podman_pull(ref: str, store: Path, *, authfile: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``podman pull`` into a private, empty image store, so every blob is fetched."""
    # podman wants a run root under 50 characters; one per store (its database remembers it).
    runroot = Path("/tmp") / f"fm-run-{hashlib.sha1(str(store).encode()).hexdigest()[:12]}"
    _RUNROOTS.add(runroot)
    cmd = ["podman", "--root", str(store / "root"), "--runroot", str(runroot),
           "--tmpdir", str(runroot / "tmp"), "--storage-driver", "vfs", "--events-backend", "none",
           "pull", "--tls-verify=false"]
    if authfile is not None:
        cmd += ["--authfile", str(authfile)]
    else:
        # No credentials from the host's auth files either.
        empty = store / "empty-auth.json"
        empty.parent.mkdir(parents=True, exist_ok=True)
        empty.write_text('{"auths": {}}')
        cmd += ["--authfile", str(empty)]
    cmd.append(ref)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def manifest(reg_url: str, name: str, tag: str, headers: dict[str, str] | None = None):
    return fetch("GET", f"{reg_url}/v2/{name}/manifests/{tag}",
                {"Accept": MANIFEST_TYPES, **(headers or {})})


def layer_digests(body: bytes) -> list[str]:
    doc = json.loads(body)
    return [doc["config"]["digest"]] + [layer["digest"] for layer in doc["layers"]]


# --------------------------------------------------------------------------- #
# anonymous registry
# --------------------------------------------------------------------------- #


async def test_anonymous_push_pull_and_access_log(busybox_image: str, tmp_path: Path) -> None:
    async with LocalRegistry() as reg:
        assert reg.host.startswith("127.0.0.1:") and reg.url == f"http://{reg.host}"
        assert reg.authfile is None and reg.username is None

        ref = await reg.apush(busybox_image, NAME_TAG)
        assert ref == f"{reg.host}/{NAME_TAG}"
        assert reg.pushed[ref].startswith("sha256:")
        assert reg.catalog() == ["flowmesh/busybox"]
        assert reg.tags("flowmesh/busybox") == ["1"]

        status, headers, body = manifest(reg.url, "flowmesh/busybox", "1")
        assert status == 200
        assert headers["docker-content-digest"] == reg.pushed[ref]
        digests = layer_digests(body)

        start = len(reg.request_log())
        proc = podman_pull(ref, tmp_path / "store")
        assert proc.returncode == 0, proc.stderr
        entries = reg.wait_for_log(lambda e: sum(x.kind == "blob" for x in e[start:]) >= len(digests))
        pulled = entries[start:]
        gets = reg.blob_gets(pulled)
        assert gets == {d: 1 for d in digests}, gets
        assert all(e.status == 200 for e in pulled if e.kind in ("blob", "manifest"))
        assert any(e.method == "GET" and e.kind == "manifest" for e in pulled)

        # Same store again: podman has every layer; it fetches the manifest and the
        # (small) config blob, not the layers.
        start = len(reg.request_log())
        proc = podman_pull(ref, tmp_path / "store")
        assert proc.returncode == 0, proc.stderr
        entries = reg.wait_for_log(lambda e: digests[0] in reg.blob_gets(e[start:]))
        time.sleep(0.1)
        assert reg.blob_gets(reg.request_log()[start:]) == {digests[0]: 1}

        storage = reg.storage_dir
        workdir = reg.workdir
        assert (storage / "docker" / "registry" / "v2" / "repositories" / "flowmesh" / "busybox").is_dir()
    assert not reg.running
    assert not workdir.exists() and not storage.exists()


def test_sync_api_given_storage_survives_restart(busybox_image: str, tmp_path: Path) -> None:
    storage = tmp_path / "blobs"
    reg = LocalRegistry(storage)
    reg.start()
    try:
        reg.push(busybox_image, "keep/me")          # no tag: :latest
        first_host = reg.host
    finally:
        reg.stop()
    assert storage.is_dir()
    with pytest.raises(urllib.error.URLError):
        _OPENER.open(f"http://{first_host}/v2/", timeout=2)
    with LocalRegistry(storage) as again:
        assert again.catalog() == ["keep/me"]
        assert again.tags("keep/me") == ["latest"]


def test_missing_binary_names_the_package() -> None:
    with pytest.raises(RegistryNotInstalled, match="apt-get install -y docker-registry"):
        LocalRegistry(binary="/nonexistent/docker-registry").start()


# --------------------------------------------------------------------------- #
# htpasswd
# --------------------------------------------------------------------------- #


def test_htpasswd_basic_auth_over_http(busybox_image: str, tmp_path: Path) -> None:
    with LocalRegistry(auth="htpasswd") as reg:
        assert reg.username and reg.password
        assert reg.password not in repr(reg)
        ref = reg.push(busybox_image, NAME_TAG)        # with the authfile

        status, headers, _ = fetch("GET", f"{reg.url}/v2/")
        assert status == 401
        assert parse_challenge(headers["www-authenticate"])[0] == "basic"
        assert manifest(reg.url, "flowmesh/busybox", "1")[0] == 401

        basic = "Basic " + base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()
        assert manifest(reg.url, "flowmesh/busybox", "1", {"Authorization": basic})[0] == 200
        wrong = "Basic " + base64.b64encode(f"{reg.username}:nope".encode()).decode()
        assert manifest(reg.url, "flowmesh/busybox", "1", {"Authorization": wrong})[0] == 401
        assert reg.catalog() == ["flowmesh/busybox"]

        denied = podman_pull(ref, tmp_path / "anon")
        assert denied.returncode != 0
        assert "unauthorized" in denied.stderr.lower() or "401" in denied.stderr, denied.stderr

        allowed = podman_pull(ref, tmp_path / "creds", authfile=reg.authfile)
        assert allowed.returncode == 0, allowed.stderr


# --------------------------------------------------------------------------- #
# token auth
# --------------------------------------------------------------------------- #


def _token(realm: str, service: str, scope: str, basic: str | None = None) -> tuple[int, dict]:
    query = urllib.parse.urlencode({"service": service, "scope": scope})
    status, _, body = fetch("GET", f"{realm}?{query}", {"Authorization": basic} if basic else {})
    return status, (json.loads(body) if status == 200 else {})


@pytest.mark.parametrize("header", ["x5c", "kid", "jwk"])
def test_token_flow_by_hand(busybox_image: str, header: str) -> None:
    with LocalRegistry(auth="token", token_server=TokenServer, token_header=header) as reg:
        reg.push(busybox_image, NAME_TAG)
        ts = reg.token_server
        assert ts is not None and reg.password not in repr(ts)

        status, headers, _ = fetch("GET", f"{reg.url}/v2/")
        assert status == 401
        scheme, params = parse_challenge(headers["www-authenticate"])
        assert scheme == "bearer"
        assert params["realm"] == ts.realm and params["realm"].startswith("http://127.0.0.1:")
        assert params["service"] == ts.service

        status, headers, _ = manifest(reg.url, "flowmesh/busybox", "1")
        assert status == 401
        scheme, params = parse_challenge(headers["www-authenticate"])
        assert params["scope"] == "repository:flowmesh/busybox:pull"

        basic = "Basic " + base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()
        status, tok = _token(params["realm"], params["service"], params["scope"], basic)
        assert status == 200
        assert tok["token"] == tok["access_token"] and tok["expires_in"] == 300
        jwt_header = json.loads(base64.urlsafe_b64decode(tok["token"].split(".")[0] + "=="))
        assert jwt_header["alg"] == "RS256" and header in jwt_header

        bearer = {"Authorization": f"Bearer {tok['token']}"}
        status, headers, body = manifest(reg.url, "flowmesh/busybox", "1", bearer)
        assert status == 200, body
        config_digest = json.loads(body)["config"]["digest"]
        status, _, blob = fetch("GET", f"{reg.url}/v2/flowmesh/busybox/blobs/{config_digest}", bearer)
        assert status == 200 and "sha256:" + hashlib.sha256(blob).hexdigest() == config_digest

        # The pull token does not cover another repository or the catalog.
        assert manifest(reg.url, "other/repo", "1", bearer)[0] == 401
        assert fetch("GET", f"{reg.url}/v2/_catalog", bearer)[0] == 401

        # Wrong password: the token server says 401; no credentials: a token without access.
        wrong = "Basic " + base64.b64encode(f"{reg.username}:nope".encode()).decode()
        assert _token(params["realm"], params["service"], params["scope"], wrong)[0] == 401
        status, anon = _token(params["realm"], params["service"], params["scope"])
        assert status == 200
        assert manifest(reg.url, "flowmesh/busybox", "1",
                        {"Authorization": f"Bearer {anon['token']}"})[0] == 401


def test_token_from_an_untrusted_key_is_refused(busybox_image: str) -> None:
    with LocalRegistry(auth="token", token_server=TokenServer) as reg, \
            TokenServer(service=reg.token_server.service, issuer=reg.token_server.issuer) as rogue:
        reg.push(busybox_image, NAME_TAG)
        forged = rogue.issue("flowmesh", [{"type": "repository", "name": "flowmesh/busybox",
                                           "actions": ["pull"]}])
        assert manifest(reg.url, "flowmesh/busybox", "1", {"Authorization": f"Bearer {forged}"})[0] == 401
        genuine = reg.token_server.issue("flowmesh", [{"type": "repository", "name": "flowmesh/busybox",
                                                       "actions": ["pull"]}])
        assert manifest(reg.url, "flowmesh/busybox", "1", {"Authorization": f"Bearer {genuine}"})[0] == 200


def test_token_podman_pull(busybox_image: str, tmp_path: Path) -> None:
    with LocalRegistry(auth="token", token_server=TokenServer) as reg:
        ref = reg.push(busybox_image, NAME_TAG)
        ts = reg.token_server
        assert any(r.account == reg.username and "push" in r.granted[0]["actions"]
                   for r in ts.requests if r.granted)
        ts.clear_requests()

        denied = podman_pull(ref, tmp_path / "anon")
        assert denied.returncode != 0
        assert "unauthorized" in denied.stderr.lower() or "authentication required" in denied.stderr.lower(), \
            denied.stderr

        allowed = podman_pull(ref, tmp_path / "creds", authfile=reg.authfile)
        assert allowed.returncode == 0, allowed.stderr
        assert any(r.account == reg.username and r.status == 200 for r in ts.requests)


def test_token_anonymous_pull_allowed(busybox_image: str, tmp_path: Path) -> None:
    with LocalRegistry(auth="token", token_server=TokenServer, anonymous_pull=True) as reg:
        ref = reg.push(busybox_image, NAME_TAG)
        proc = podman_pull(ref, tmp_path / "anon")
        assert proc.returncode == 0, proc.stderr
        anon = [r for r in reg.token_server.requests if r.account is None]
        assert anon and all(a["actions"] == ["pull"] for r in anon for a in r.granted)
        # Anonymous clients still cannot push or list.
        assert reg.request("GET", "/v2/_catalog", credentials=False).status == 401


# --------------------------------------------------------------------------- #
# fault proxy
# --------------------------------------------------------------------------- #


@pytest.fixture
def reg_and_proxy(busybox_image: str):
    with LocalRegistry() as reg, FaultProxy(reg.host) as proxy:
        reg.push(busybox_image, NAME_TAG)
        yield reg, proxy


def test_proxy_counts_a_podman_pull(reg_and_proxy, tmp_path: Path) -> None:
    reg, proxy = reg_and_proxy
    start = len(reg.request_log())
    proc = podman_pull(f"{proxy.host}/{NAME_TAG}", tmp_path / "store")
    assert proc.returncode == 0, proc.stderr
    digests = layer_digests(manifest(reg.url, "flowmesh/busybox", "1")[2])
    assert proxy.manifest_gets == 1
    assert proxy.blob_gets == {d: 1 for d in digests}
    # The registry saw the same blob GETs.
    entries = reg.wait_for_log(lambda e: len(reg.blob_gets(e[start:])) == len(digests))
    assert reg.blob_gets(entries[start:]) == {d: 1 for d in digests}


def test_proxy_keep_alive_head_and_large_blob(reg_and_proxy) -> None:
    reg, proxy = reg_and_proxy
    # A 24 MiB blob, uploaded straight to the registry (monolithic POST + PUT).
    data = os.urandom(24 << 20)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    status, headers, _ = fetch("POST", f"{reg.url}/v2/big/blob/blobs/uploads/", data=b"")
    assert status == 202
    location = urllib.parse.urljoin(reg.url, headers["location"])
    sep = "&" if "?" in location else "?"
    status, _, body = fetch("PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", data=data,
                           headers={"Content-Type": "application/octet-stream"})
    assert status == 201, body

    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request("GET", "/v2/")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"{}"
        sock = conn.sock
        conn.request("HEAD", f"/v2/big/blob/blobs/{digest}")
        resp = conn.getresponse()
        assert resp.status == 200 and int(resp.getheader("Content-Length")) == len(data)
        assert resp.read() == b""
        conn.request("GET", f"/v2/big/blob/blobs/{digest}")
        resp = conn.getresponse()
        got = hashlib.sha256()
        while chunk := resp.read(1 << 20):
            got.update(chunk)
        assert resp.status == 200 and "sha256:" + got.hexdigest() == digest
        conn.request("GET", "/v2/big/blob/manifests/none")
        resp = conn.getresponse()
        assert resp.status == 404
        resp.read()
        assert conn.sock is sock, "the proxy closed a keep-alive connection"
    finally:
        conn.close()
    assert proxy.blob_gets == {digest: 1}
    assert [r.method for r in proxy.records] == ["GET", "HEAD", "GET", "GET"]


def test_proxy_injects_429(reg_and_proxy, tmp_path: Path) -> None:
    reg, proxy = reg_and_proxy
    url = f"{proxy.url}/v2/flowmesh/busybox/manifests/1"
    proxy.fail_next(2, status=429, retry_after=1)
    for _ in range(2):
        status, headers, body = fetch("GET", url, {"Accept": MANIFEST_TYPES})
        assert status == 429 and headers["retry-after"] == "1"
        assert json.loads(body)["errors"][0]["code"] == "TOOMANYREQUESTS"
    assert fetch("GET", url, {"Accept": MANIFEST_TYPES})[0] == 200
    assert proxy.manifest_gets == 3
    assert [r.fault for r in proxy.records] == ["fail", "fail", None]

    # Only blobs: podman waits Retry-After and tries again.
    proxy.reset_counts()
    proxy.fail_next(1, status=429, retry_after=1, kind="blob")
    proc = podman_pull(f"{proxy.host}/{NAME_TAG}", tmp_path / "store")
    assert proc.returncode == 0, proc.stderr
    faulted = [r for r in proxy.records if r.fault == "fail"]
    assert len(faulted) == 1 and faulted[0].kind == "blob" and faulted[0].status == 429
    assert sum(proxy.blob_gets.values()) == len(proxy.blob_gets) + 1

    proxy.fail_next(1, status=503, retry_after=None)
    status, headers, _ = fetch("GET", f"{proxy.url}/v2/")
    assert status == 503 and "retry-after" not in headers


def test_proxy_corrupts_blobs(reg_and_proxy, tmp_path: Path) -> None:
    reg, proxy = reg_and_proxy
    body = manifest(proxy.url, "flowmesh/busybox", "1")[2]
    digest = layer_digests(body)[1]
    proxy.corrupt_next_blob()
    status, _, blob = fetch("GET", f"{proxy.url}/v2/flowmesh/busybox/blobs/{digest}")
    assert status == 200
    assert "sha256:" + hashlib.sha256(blob).hexdigest() != digest
    status, _, again = fetch("GET", f"{proxy.url}/v2/flowmesh/busybox/blobs/{digest}")
    assert len(again) == len(blob) and "sha256:" + hashlib.sha256(again).hexdigest() == digest

    proxy.corrupt_next_blob()
    proc = podman_pull(f"{proxy.host}/{NAME_TAG}", tmp_path / "store")
    assert proc.returncode != 0
    assert "does not match" in proc.stderr or "digest" in proc.stderr.lower(), proc.stderr


def test_proxy_down_refuses_connections(reg_and_proxy) -> None:
    reg, proxy = reg_and_proxy
    assert fetch("GET", f"{proxy.url}/v2/")[0] == 200
    # A kept-alive connection is cut too.
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    conn.request("GET", "/v2/")
    conn.getresponse().read()
    proxy.down()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
    with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
        conn.request("GET", "/v2/")
        conn.getresponse().read()
    conn.close()
    proxy.up()
    assert fetch("GET", f"{proxy.url}/v2/")[0] == 200


def test_proxy_upstream_down_is_502(busybox_image: str) -> None:
    reg = LocalRegistry().start()
    proxy = FaultProxy(reg.host).start()
    try:
        reg.stop()
        status, _, body = fetch("GET", f"{proxy.url}/v2/")
        assert status == 502
        assert proxy.records[-1].fault == "upstream-down"
    finally:
        proxy.stop()
        reg.stop()


def test_registry_error_is_clear_when_push_fails(busybox_image: str) -> None:
    with LocalRegistry() as reg:
        with pytest.raises(LocalRegistryError, match="podman push"):
            reg.push("localhost/flowmesh/does-not-exist:0", "x/y:1")


def test_htpasswd_without_bcrypt_uses_the_provisioned_user(monkeypatch, busybox_image: str) -> None:
    import flowmesh_sdk.registry.local as registry_mod

    monkeypatch.setattr(registry_mod, "_bcrypt_entry", lambda user, password: None)
    with LocalRegistry(auth="htpasswd") as reg:
        assert reg.username == "docker" and reg.password
        assert fetch("GET", f"{reg.url}/v2/")[0] == 401
        reg.push(busybox_image, NAME_TAG)
        assert reg.catalog() == ["flowmesh/busybox"]
    with pytest.raises(LocalRegistryError, match="apache2-utils"):
        LocalRegistry(auth="htpasswd", password="given").start()


async def test_proxy_async_api_and_tls_probe(busybox_image: str) -> None:
    async with LocalRegistry() as reg, FaultProxy(reg.host) as proxy:
        # What podman sends first with --tls-verify=false: a TLS ClientHello.  The proxy
        # answers in plain HTTP at once, so the client falls back to http.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as s:
            s.sendall(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + os.urandom(32))
            first = s.recv(64)   # aiohttp answers an unparseable request as HTTP/1.0
            assert first.startswith((b"HTTP/1.1 400 ", b"HTTP/1.0 400 ")), first
        assert fetch("GET", f"{proxy.url}/v2/")[0] == 200
