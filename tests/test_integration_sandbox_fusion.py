"""The SandboxFusion-compatible server (flowmesh_sdk.integrations.sandbox_fusion) driven by
the real ``sandbox-fusion`` client (0.3.7: its sync ``run_code``/``run_jupyter`` and async
``run_code_async``/``run_jupyter_async``) on a real local pool (podman, the code-runner
image built here from Debian packages: swe-base plus g++): right and wrong answers, a C++
compile error, compile and run timeouts, stdin, files in and ``fetch_files`` out, Jupyter
cells, errors in SandboxFusion's shape (never a 500), a 100-request burst on a 2-slot pool
(all answered, none lost), the overload answer of a full queue, a request while the pool
drains, ``flowmesh serve sandbox-fusion`` as a process stopped by SIGTERM, and verl's own
sandbox-fusion reward code pointed at the server where verl is installed.  Every address
is on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import importlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import sandbox_fusion as sf

from flowmesh_sdk.errors import IntegrationMissingError, SpecError
from flowmesh_sdk.integrations.sandbox_fusion import (DEFAULT_LANGUAGES, Admission, Admit, RunCodeRequest,
                                                      SandboxFusionServer, ServerConfig, parse_image_overrides,
                                                      with_images)
from conftest import local_pool, podman_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HELLO_CPP = '#include <iostream>\nint main() { std::string s; std::cin >> s; std::cout << "hi " << s; return 0; }\n'
# constant evaluation g++ cannot finish in a second (nested loops, each under the loop limit)
SLOW_CPP = ("constexpr long spin() { long s = 0; for (long i = 0; i < 200000; ++i) for (long j = 0; j < 200000; ++j)"
            " s += i ^ j; return s; }\nstatic_assert(spin() != 1);\nint main() { return 0; }\n")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def code_image(images_mod) -> str:
    return images_mod.build_code_runner()


@pytest.fixture(scope="module")
async def fleet_pool(tmp_path_factory, code_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-sf"), "fusion", sandboxes_per_instance=2) as fp:
        yield fp


@pytest.fixture(scope="module")
async def server(fleet_pool):
    _, pool = fleet_pool
    async with SandboxFusionServer(pool, ServerConfig(queue_size=200)) as srv:
        assert srv.admission.slots == 2           # the pool's capacity: one instance of 2 slots
        yield srv


async def _until(pred, what: str) -> None:   # noqa: ARG001 - what: for the reader
    """Poll ``pred`` (a state, not a time: the bound is the test's timeout)."""
    while not pred():
        await asyncio.sleep(0.02)


async def code(server: SandboxFusionServer, **kw) -> sf.RunCodeResponse:
    return await sf.run_code_async(sf.RunCodeRequest(**kw), endpoint=server.url, max_attempts=1)


async def test_right_and_wrong_answers_with_the_sync_client(server):
    def both() -> tuple[sf.RunCodeResponse, sf.RunCodeResponse, sf.RunCodeResponse]:
        sf.set_endpoint(server.url)               # the client's module-level endpoint
        right = sf.run_code(sf.RunCodeRequest(code="print(6 * 7)", language="python"), max_attempts=1)
        wrong = sf.run_code(sf.RunCodeRequest(code="assert 6 * 7 == 43, 'no'", language="python"), max_attempts=1)
        shell = sf.run_code(sf.RunCodeRequest(code="echo $((2+3)); echo err >&2; exit 4", language="bash"),
                            max_attempts=1)
        return right, wrong, shell
    right, wrong, shell = await asyncio.to_thread(both)   # the server runs on this loop
    assert right.status == sf.RunStatus.Success and right.message == "" and right.compile_result is None
    rr = right.run_result
    assert rr.status == sf.CommandRunStatus.Finished and rr.return_code == 0 and rr.stdout == "42\n"
    assert rr.execution_time is not None and rr.execution_time >= 0 and right.executor_pod_name
    assert wrong.status == sf.RunStatus.Failed and wrong.run_result.return_code == 1
    assert "AssertionError: no" in wrong.run_result.stderr
    assert shell.status == sf.RunStatus.Failed and shell.run_result.return_code == 4
    assert (shell.run_result.stdout, shell.run_result.stderr) == ("5\n", "err\n")
    assert sf.summary_run_code_result(shell, sf.SummaryMapping(RunFailed="RE")) == "RE"


async def test_cpp_compiles_then_runs_and_a_compile_error_stops_it(server):
    ok = await code(server, code=HELLO_CPP, language="cpp", stdin="there")
    assert ok.status == sf.RunStatus.Success
    assert ok.compile_result.status == sf.CommandRunStatus.Finished and ok.compile_result.return_code == 0
    assert ok.run_result.stdout == "hi there" and ok.run_result.return_code == 0
    bad = await code(server, code="int main() { return undefined_name; }", language="cpp")
    assert bad.status == sf.RunStatus.Failed and bad.run_result is None
    assert bad.compile_result.return_code != 0 and "undefined_name" in bad.compile_result.stderr
    assert sf.summary_run_code_result(bad, sf.SummaryMapping(CompileFailed="CE")) == "CE"


async def test_compile_and_run_timeouts(server):
    slow = await code(server, code=SLOW_CPP, language="cpp", compile_timeout=1)
    assert slow.status == sf.RunStatus.Failed and slow.run_result is None
    assert slow.compile_result.status == sf.CommandRunStatus.TimeLimitExceeded
    assert slow.compile_result.return_code is None
    assert sf.summary_run_code_result(slow, sf.SummaryMapping(CompileTimeout="CTLE")) == "CTLE"
    loop = await code(server, code="print('start', flush=True)\nwhile True: pass", language="python", run_timeout=1)
    assert loop.status == sf.RunStatus.Failed
    assert loop.run_result.status == sf.CommandRunStatus.TimeLimitExceeded and loop.run_result.return_code is None
    assert loop.run_result.stdout == "start\n"
    assert sf.summary_run_code_result(loop, sf.SummaryMapping(RunTimeout="TLE")) == "TLE"


async def test_stdin_files_in_and_fetch_files_out(server):
    program = ("import sys\nfrom helper import twice\ndata = open('data/in.bin', 'rb').read()\n"
               "name = sys.stdin.read().strip()\nopen('out.txt', 'w').write(twice(name))\n"
               "open('/tmp/abs.bin', 'wb').write(data[::-1])\nprint(len(data))\n")
    blob = bytes(range(256)) + b"\x00\x00end"
    r = await code(server, code=program, language="python", stdin="ab\n",
                   files={"helper.py": b64(b"def twice(s):\n    return s * 2\n"), "data/in.bin": b64(blob),
                          "skipped.txt": None},
                   fetch_files=["out.txt", "/tmp/abs.bin", "data/in.bin", "missing.txt", "data"])
    assert r.status == sf.RunStatus.Success, r
    assert r.run_result.stdout == f"{len(blob)}\n"
    assert set(r.files) == {"out.txt", "/tmp/abs.bin", "data/in.bin"}   # absent and directories left out
    assert base64.b64decode(r.files["out.txt"]) == b"abab"
    assert base64.b64decode(r.files["/tmp/abs.bin"]) == blob[::-1]
    assert base64.b64decode(r.files["data/in.bin"]) == blob
    none = await code(server, code="import sys; print(repr(sys.stdin.read()))", language="python")
    assert none.run_result.stdout == "''\n"                          # no stdin: an empty one


async def test_jupyter_cells_with_both_clients(server):
    cells = ["a = 123", "a", "print(a)", "import sys; sys.stderr.write('stderr message')",
             "raise RuntimeError('error message')", "a + 1"]
    r = await sf.run_jupyter_async(sf.RunJupyterRequest(cells=cells, files={"m.py": b64(b"X = 5\n")},
                                                        fetch_files=["m.py"]), endpoint=server.url, max_attempts=1)
    assert r.status == sf.RunStatus.Success and r.driver.status == sf.CommandRunStatus.Finished
    # as a kernel: the value of a last expression is shown (write() returns the count, 14)
    assert [c.display for c in r.cells] == [[], [{"text/plain": "123"}], [], [{"text/plain": "14"}], [],
                                            [{"text/plain": "124"}]]
    assert r.cells[2].stdout == "123\n" and r.cells[3].stderr == "stderr message"
    err = r.cells[4].error
    assert len(err) == 1 and err[0]["ename"] == "RuntimeError" and err[0]["evalue"] == "error message"
    assert "RuntimeError: error message" in "".join(err[0]["traceback"])
    assert base64.b64decode(r.files["m.py"]) == b"X = 5\n"
    late = await asyncio.to_thread(sf.run_jupyter, sf.RunJupyterRequest(cells=["import m; m.X", "while True: pass"],
                                                                         cell_timeout=1, files={"m.py": b64(b"X=5")}),
                                   endpoint=server.url, max_attempts=1)
    assert late.status == sf.RunStatus.Failed and late.cells == []   # as SandboxFusion: no cells unless all ran


async def test_errors_come_in_sandbox_fusions_shape_never_a_500(server, fleet_pool):
    async with aiohttp.ClientSession() as http:
        async def post(path: str, **kw) -> tuple[int, dict]:
            async with http.post(f"{server.url}{path}", **kw) as resp:
                return resp.status, await resp.json()

        st, body = await post("/run_code", json={"code": "x", "language": "cobol"})
        assert st == 422 and body["status"] == "SandboxError" and "run_code.language" in body["message"]
        assert body["detail"][0]["loc"] == ["body", "language"]
        st, body = await post("/run_code", json={"language": "python"})
        assert st == 422 and "run_code.code: is required" in body["message"]
        st, body = await post("/run_code", json={"code": "x", "language": "python", "run_timeout": "soon"})
        assert st == 422 and "run_code.run_timeout: must be a number" in body["message"]
        st, body = await post("/run_code", data=b"{not json", headers={"Content-Type": "application/json"})
        assert st == 422 and body["status"] == "SandboxError"
        st, body = await post("/run_jupyter", json={"cells": "print(1)"})
        assert st == 422 and "run_jupyter.cells" in body["message"] and body["cells"] == []
        # known to SandboxFusion, not served here: HTTP 200, status SandboxError, the languages named
        st, body = await post("/run_code", json={"code": "x", "language": "go"})
        assert st == 200 and body["status"] == "SandboxError" and "bash, cpp, pytest, python" in body["message"]
        st, body = await post("/run_code", json={"code": "x", "language": "python", "run_timeout": -1})
        assert st == 200 and "run_code.run_timeout" in body["message"]
        st, body = await post("/run_code", json={"code": "x", "language": "python", "files": {"a": "%%%"}})
        assert st == 200 and "run_code.files['a']: must be base64" in body["message"]
        async with http.get(f"{server.url}/v1/ping") as resp:
            assert resp.status == 200 and await resp.json() == "pong"
    # the client raises on SandboxError (its retries are the caller's choice)
    with pytest.raises(Exception, match="Sandbox responded with error: run_code.language: 'go' is not served"):
        await code(server, code="x", language="go")
    # a FlowMesh error from the pool (here: the image does not resolve) is a SandboxError too
    _, pool = fleet_pool
    async with SandboxFusionServer(pool, images={"python": "localhost/flowmesh/no-such-image:1"}) as broken:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{broken.url}/run_code", json={"code": "print(1)", "language": "python"}) as resp:
                body = await resp.json()
        assert resp.status == 200 and body["status"] == "SandboxError"
        assert body["message"].startswith("ImageNotFoundError:") and body["run_result"] is None


async def test_a_burst_of_100_on_2_slots_is_all_answered(fleet_pool):
    _, pool = fleet_pool
    async with SandboxFusionServer(pool, ServerConfig(queue_size=100)) as srv:
        answers = await asyncio.gather(*(code(srv, code=f"print({i} * {i})", language="python")
                                         for i in range(100)))
        assert [a.run_result.stdout for a in answers] == [f"{i * i}\n" for i in range(100)]
        assert all(a.status == sf.RunStatus.Success for a in answers)
        await _until(lambda: srv.admission.stats().running == 0, "the last sandboxes torn down (after answering)")
        st = srv.admission.stats()
        assert (st.admitted, st.overloaded, st.timed_out, st.running, st.queued) == (100, 0, 0, 0, 0)
        assert len({a.executor_pod_name for a in answers}) == 100   # a fresh sandbox each


async def test_a_full_queue_answers_overloaded_at_once(fleet_pool):
    _, pool = fleet_pool
    async with SandboxFusionServer(pool, ServerConfig(slots=1, queue_size=1, queue_timeout_s=120)) as srv:
        st = srv.admission.stats
        hold = asyncio.ensure_future(code(srv, code="import time; time.sleep(60)", language="python", run_timeout=8))
        await _until(lambda: st().running == 1, "the first admitted")
        queued = asyncio.ensure_future(code(srv, code="print('second')", language="python"))
        await _until(lambda: st().queued == 1, "the second queued")
        with pytest.raises(Exception, match="Sandbox responded with error: overloaded: 1 requests running"):
            await code(srv, code="print('third')", language="python")
        assert st().overloaded == 1
        first, second = await asyncio.gather(hold, queued)
        assert first.run_result.status == sf.CommandRunStatus.TimeLimitExceeded
        assert second.run_result.stdout == "second\n"
    gate = Admission(1, 0)                       # no queue: a busy slot refuses at once
    assert await gate.acquire(1.0) is Admit.OK and await gate.acquire(1.0) is Admit.OVERLOADED
    gate.release()
    gate.close()
    assert await gate.acquire(1.0) is Admit.CLOSED


async def test_a_request_while_the_pool_drains(tmp_path, code_image):
    async with local_pool(tmp_path / "fmhome", "fusion-drain") as (fleet, pool):
        async with SandboxFusionServer(pool) as srv:
            running = asyncio.ensure_future(code(srv, code="import time; time.sleep(2); print('done')",
                                                 language="python"))
            await _until(lambda: srv.admission.stats().running == 1, "admitted")
            await _until(lambda: pool.stats().in_flight == 1, "in its sandbox")
            drain = asyncio.ensure_future(pool.drain())
            await asyncio.sleep(0)               # drain() marks the pool closing before its first await
            with pytest.raises(Exception, match="Sandbox responded with error: PoolClosedError: pool "
                                                "'fusion-drain' is draining"):
                await code(srv, code="print(1)", language="python")
            assert (await running).run_result.stdout == "done\n"   # what ran finishes
            await drain
        assert podman_names(f"flowmesh.pool={pool.name}") == []


def test_cli_serves_until_sigterm_then_drains(tmp_path, code_image):
    env = {**os.environ, "FLOWMESH_HOME": str(tmp_path / "fmhome"), "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "flowmesh_sdk", "serve", "sandbox-fusion", "--port", "0",
                             "--cpus", "2", "--memory", "4", "--slots", "2", "--fleet", "sf-cli", "--queue", "8"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving (http://127\.0\.0\.1:\d+) \(pool sandbox-fusion: 2 slots, queue 8;", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        r = sf.run_code(sf.RunCodeRequest(code="print('via the CLI')", language="python"), endpoint=m.group(1),
                        max_attempts=1)
        assert r.run_result.stdout == "via the CLI\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert podman_names("flowmesh.fleet=sf-cli") == []


def _verl_sandbox_fusion():
    """verl's reward code (verl/utils/reward_score/sandbox_fusion/) loaded from its files
    alone: importing it through ``verl`` would import verl's heavy dependencies (torch, ray)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("verl is not installed here: its sandbox-fusion reward code was not run "
                    "(pip install verl==0.9.1 to run it; it needs only requests)")
    pkg_dir = Path(next(iter(spec.submodule_search_locations))) / "utils" / "reward_score" / "sandbox_fusion"
    name = "_verl_sandbox_fusion"
    pkg = importlib.util.spec_from_file_location(name, pkg_dir / "__init__.py",
                                                 submodule_search_locations=[str(pkg_dir)])
    module = importlib.util.module_from_spec(pkg)
    sys.modules[name] = module
    pkg.loader.exec_module(module)
    return module


async def test_verl_reward_code_scores_against_the_server(server):
    verl_sf = _verl_sandbox_fusion()
    tests = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    wrong = "```python\na, b = map(int, input().split())\nprint(a * b)\n```"
    score, meta = await asyncio.to_thread(verl_sf.compute_score, server.run_code_url, None, 1024, right, tests)
    assert score == 1.0, meta
    score, meta = await asyncio.to_thread(verl_sf.compute_score, server.run_code_url, None, 1024, wrong, tests)
    assert score == 0.0 and meta


def test_request_records_name_the_field():
    with pytest.raises(SpecError, match=r"run_code.fetch_files\[1\]: must be a string"):
        RunCodeRequest.from_json({"code": "", "language": "python", "fetch_files": ["a", 3]})
    with pytest.raises(SpecError, match=r"run_code.compile_timeout: must be a number, got bool"):
        RunCodeRequest.from_json({"code": "", "language": "python", "compile_timeout": True})
    assert RunCodeRequest.from_json({"code": "c", "language": "cpp", "extra": 1}).run_timeout == 10.0
    assert parse_image_overrides(["cpp=gcc:14"]) == {"cpp": "gcc:14"}
    with pytest.raises(SpecError, match="--image: must be LANG=IMAGE"):
        parse_image_overrides(["gcc:14"])
    with pytest.raises(SpecError, match=r"languages: no language 'cobol'"):
        with_images(DEFAULT_LANGUAGES, {"cobol": "x:1"})
    with pytest.raises(SpecError, match=r"server.queue_size"):
        ServerConfig(queue_size=-1)


def test_missing_aiohttp_names_the_extra(monkeypatch):
    for mod in [m for m in sys.modules if m.startswith("flowmesh_sdk.integrations.sandbox_fusion")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "aiohttp", None)         # as if aiohttp were not installed
    with pytest.raises(IntegrationMissingError, match=r"pip install 'flowmesh-sdk\[sandbox-fusion\]'"):
        importlib.import_module("flowmesh_sdk.integrations.sandbox_fusion")


def test_the_core_imports_neither_the_server_nor_its_client():
    code = ("import sys, flowmesh_sdk, flowmesh_sdk.fleet, flowmesh_sdk.sync, flowmesh_sdk.cli.main; "
            "print(sorted(m for m in ('sandbox_fusion', 'flowmesh_sdk.integrations.sandbox_fusion') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


def test_cli_refuses_zero_sizes_naming_the_option(tmp_path):
    """``--cpus 0`` (or ``--slots 0``, ``--memory 0``) is refused before any fleet starts: it
    was read as "not given" and served on this host's default size."""
    from typer.testing import CliRunner

    from flowmesh_sdk.cli.main import app
    for opt, value in (("--cpus", "0"), ("--slots", "0"), ("--memory", "0")):
        res = CliRunner().invoke(app, ["serve", "sandbox-fusion", "--port", "0", opt, value],
                                 env={"FLOWMESH_HOME": str(tmp_path)})
        assert res.exit_code == 1 and f"{opt}: must be in" in res.output and "serving" not in res.output, res.output
