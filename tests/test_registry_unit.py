"""Image references, credentials files, the pull budget and the resolvers' cache (no
registry needed)."""

import asyncio
import json
import os

import pytest

from flowmesh_sdk.control import InProcessBackend
from flowmesh_sdk.errors import AuthError, RegistryUnavailableError, SpecError, ThrottledError
from flowmesh_sdk.images import ImageInfo, PullBudget, PullPolicy, _Cache
from flowmesh_sdk.registry.auth import Credentials, load_credentials, write_auth_file
from flowmesh_sdk.registry.reference import ImageRef
from flowmesh_sdk.sim.loop import run as run_virtual

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, registry, repo, tag, digest", [
    ("python", "docker.io", "library/python", "latest", None),
    ("python:3.11", "docker.io", "library/python", "3.11", None),
    ("org/app:v1", "docker.io", "org/app", "v1", None),
    ("127.0.0.1:5000/flowmesh/swe-base:bookworm", "127.0.0.1:5000", "flowmesh/swe-base", "bookworm", None),
    ("localhost/flowmesh/busybox:1", "localhost", "flowmesh/busybox", "1", None),
    (f"ghcr.io/a/b/c@{D}", "ghcr.io", "a/b/c", None, D),
    (f"reg.example:443/x:t@{D}", "reg.example:443", "x", "t", D),
])
def test_reference_parsing(text, registry, repo, tag, digest):
    ref = ImageRef.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repo, tag, digest)
    assert ref.reference == (digest or tag)


@pytest.mark.parametrize("bad", ["", "UPPER/case", "a b", "x@sha256:123", "x:-bad", "x:"])
def test_reference_rejects(bad):
    with pytest.raises(SpecError, match="image"):
        ImageRef.parse(bad)


def test_pinning_and_loopback():
    ref = ImageRef.parse("127.0.0.1:5000/flowmesh/swe-base:bookworm")
    assert ref.loopback and ImageRef.parse("localhost:5000/x").loopback
    assert not ImageRef.parse("registry.example.com/x").loopback
    assert ref.with_digest(D).pinned() == f"127.0.0.1:5000/flowmesh/swe-base@{D}"
    with pytest.raises(ValueError):
        ref.pinned()


def test_credentials_from_auth_files_never_in_repr(tmp_path, monkeypatch):
    path = write_auth_file(tmp_path / "auth.json", "127.0.0.1:5000", Credentials("alice", "s3cret"))
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert json.loads(path.read_text())["auths"]["127.0.0.1:5000"]["auth"]
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(path))
    creds = load_credentials("127.0.0.1:5000")
    assert creds == Credentials("alice", "s3cret")
    assert "s3cret" not in repr(creds) and "s3cret" not in str(creds)
    assert load_credentials("other:1") is None
    monkeypatch.setenv("FLOWMESH_REGISTRY_AUTH_OTHER_1", "bob:pa:ss")
    assert load_credentials("other:1") == Credentials("bob", "pa:ss")
    err = AuthError("registry x refused", provider="x")
    assert "s3cret" not in str(err)


async def test_pull_budget_retries_throttling_then_succeeds():
    retries: list[tuple[str, int]] = []
    budget = PullBudget(InProcessBackend(), PullPolicy(attempts=4, backoff_s=0.01, backoff_max_s=0.05),
                        on_retry=lambda what, n, exc, wait: retries.append((what, n)))
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ThrottledError("429", provider="r", retry_after_s=0.01)
        return "ok"

    assert await budget.run("r", "resolve x", flaky) == "ok"
    assert calls == 3 and retries == [("resolve x", 1), ("resolve x", 2)]


async def test_pull_budget_gives_up_and_does_not_retry_auth():
    budget = PullBudget(InProcessBackend(), PullPolicy(attempts=3, backoff_s=0.01, backoff_max_s=0.02))
    calls = 0

    async def down() -> None:
        nonlocal calls
        calls += 1
        raise RegistryUnavailableError("connection refused", provider="r")

    with pytest.raises(RegistryUnavailableError):
        await budget.run("r", "pull", down)
    assert calls == 3

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise AuthError("no", provider="r")

    calls = 0
    with pytest.raises(AuthError):
        await budget.run("r", "pull", refused)
    assert calls == 1


async def test_pull_budget_caps_concurrent_pulls():
    budget = PullBudget(InProcessBackend(), PullPolicy(max_concurrent_pulls=2, rate_per_s=1000, burst=100))
    running = peak = 0

    async def pull() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1

    await asyncio.gather(*(budget.run("r", f"pull {i}", pull, pull=True) for i in range(6)))
    assert peak == 2


def test_resolver_cache_is_single_flight_and_holds_only_what_is_within_its_ttl():
    """One fetch for concurrent asks; a hit until the TTL; a failure not kept; and a
    coordinator resolving a new image every 10 s (a SWE-style batch) holds the last
    30 s of them, not every image it ever saw (on virtual time: every instant exact)."""
    fetched: list[str] = []

    def fetcher(image: str, fail: bool = False):
        async def fetch() -> ImageInfo:
            fetched.append(image)
            await asyncio.sleep(1)
            if fail:
                raise RegistryUnavailableError("reg is down")
            return ImageInfo(image=image, digest=D, run_ref=f"{image}@{D}", registry="reg")
        return fetch

    async def scenario() -> None:
        cache = _Cache(30.0)
        a, b = await asyncio.gather(cache.get("a", fetcher("a")), cache.get("a", fetcher("a")))
        assert a is b and fetched == ["a"]                      # one fetch, shared
        await asyncio.sleep(28)                                 # stored at t=1: a hit until t=31
        assert await cache.get("a", fetcher("a")) is a and fetched == ["a"]
        await asyncio.sleep(2)
        assert await cache.get("a", fetcher("a")) is not a and fetched == ["a", "a"]
        with pytest.raises(RegistryUnavailableError):
            await cache.get("x", fetcher("x", fail=True))
        assert "x" not in cache._hits
        for i in range(20):                                     # a new image every 10 s
            await cache.get(f"img{i}", fetcher(f"img{i}"))
            await asyncio.sleep(9)
            held = list(cache._hits)
            assert len(held) <= 4, held                         # what is younger than 30 s, and the newest
            assert held[-1] == f"img{i}"
        assert held == ["img17", "img18", "img19"]

    run_virtual(scenario())
