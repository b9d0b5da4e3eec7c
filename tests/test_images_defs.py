"""The image definitions under images/.

* The GPU worker (images/gpu-worker) cannot be built here (no GPU, no internet), so
  its Containerfile is checked by a small parser, and its entrypoint by running it
  with ``--dry-run`` under fake GPU environments.
* SWE task images are built for real with ``podman build`` FROM swe-base, run, and
  (when the ``docker-registry`` package is installed) pushed to a loopback registry
  to show that a second task image adds only its one small layer.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from flowmesh_sdk.imagebuild import GPU_WORKER_DIR, SWE_TASK_CONTAINERFILE

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = GPU_WORKER_DIR
GPU_CONTAINERFILE = GPU_DIR / "Containerfile"
ENTRYPOINT = GPU_DIR / "entrypoint.py"

KNOWN_INSTRUCTIONS = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "ENTRYPOINT", "CMD",
                      "LABEL", "EXPOSE", "USER", "HEALTHCHECK"}


# --------------------------------------------------------------------------- #
# (a) a small Containerfile parser
# --------------------------------------------------------------------------- #

class ContainerfileError(ValueError):
    pass


def parse_containerfile(text: str) -> list[tuple[str, str, int]]:
    """``[(INSTRUCTION, arguments, first line number)]``.

    Handles comments and blank lines (also inside a continuation, as BuildKit
    does) and backslash continuations. Raises ContainerfileError for an unknown
    or lowercase instruction, or a dangling continuation at the end of the file.
    """
    out: list[tuple[str, str, int]] = []
    buf: str | None = None
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if buf is None:
            buf, start = "", lineno
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, args = buf.strip().partition(" ")
        if word not in KNOWN_INSTRUCTIONS:
            raise ContainerfileError(f"line {start}: unknown instruction {word!r}")
        out.append((word, " ".join(args.split()), start))
        buf = None
    if buf is not None:
        raise ContainerfileError(f"line {start}: continuation runs past the end of the file")
    if not out or out[0][0] not in ("FROM", "ARG"):
        raise ContainerfileError("the first instruction must be FROM (or ARG)")
    return out


def _json_array(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


_PINNED_REF = re.compile(
    r"^(?:(?P<registry>[a-z0-9.-]+(?::\d+)?)/)?(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})(?:@sha256:[0-9a-f]{64})?$")


def test_parser_rejects_what_it_should():
    with pytest.raises(ContainerfileError, match="unknown instruction 'FORM'"):
        parse_containerfile("FROM a:1\nFORM b\n")
    with pytest.raises(ContainerfileError, match="continuation"):
        parse_containerfile("FROM a:1\nRUN true \\\n")
    with pytest.raises(ContainerfileError, match="unknown instruction 'from'"):
        parse_containerfile("from a:1\n")
    with pytest.raises(ContainerfileError, match="first instruction"):
        parse_containerfile("RUN true\n")
    got = parse_containerfile("# c\nFROM a:1\nRUN a \\\n  # inner comment\n\n  && b\nCMD [\"x\"]\n")
    assert got == [("FROM", "a:1", 2), ("RUN", "a && b", 3), ("CMD", '["x"]', 7)]


def test_gpu_containerfile_parses_and_is_pinned():
    instrs = parse_containerfile(GPU_CONTAINERFILE.read_text())
    kinds = [k for k, _, _ in instrs]
    assert set(kinds) <= KNOWN_INSTRUCTIONS

    # FROM: pinned (a tag that is not "latest"; no build-arg indirection), from a CUDA image
    froms = [a for k, a, _ in instrs if k == "FROM"]
    assert froms, "no FROM"
    for ref in froms:
        m = _PINNED_REF.match(ref.split()[0])  # "IMAGE [AS name]"
        assert m, f"FROM {ref!r} is not a pinned name:tag"
        assert m["tag"] != "latest", f"FROM {ref!r} uses latest"
        assert "$" not in ref
    assert re.search(r"nvidia/cuda:\d+\.\d+(\.\d+)?-cudnn-runtime-ubuntu\d\d\.\d\d$", froms[0]), froms[0]
    assert froms[0].startswith(("docker.io/", "nvcr.io/")), "name the registry explicitly"

    # ENTRYPOINT runs entrypoint.py, which the Containerfile COPYs from this folder
    entry = [a for k, a, _ in instrs if k == "ENTRYPOINT"]
    assert len(entry) == 1
    argv = _json_array(entry[0])
    script = next(a for a in argv if a.endswith("/entrypoint.py"))
    copies = [a.split() for k, a, _ in instrs if k == "COPY"]
    assert any(c[0] == "entrypoint.py" and (c[-1] == script or c[-1].rstrip("/") + "/entrypoint.py" == script)
               for c in copies), f"nothing COPYs entrypoint.py to {script}: {copies}"
    assert (GPU_DIR / "entrypoint.py").is_file()
    # the interpreter the ENTRYPOINT names is the venv the RUN steps create
    run_text = " ".join(a for k, a, _ in instrs if k == "RUN")
    assert argv[0].startswith("/opt/venv/") and "python3 -m venv /opt/venv" in run_text

    # the HEALTHCHECK uses the same script; EXPOSE matches its default port
    hc = [a for k, a, _ in instrs if k == "HEALTHCHECK"]
    assert len(hc) == 1 and script in hc[0] and "health" in hc[0]
    assert [a for k, a, _ in instrs if k == "EXPOSE"] == ["8000"]
    assert "DEFAULT_PORT = 8000" in ENTRYPOINT.read_text()

    # vLLM and TRL (and everything else pip installs) are pinned with ==
    pip_args = []
    for k, a, _ in instrs:
        if k != "RUN":
            continue
        for m in re.finditer(r"pip install (.*?)(?:&&|$)", a):
            pip_args += [t for t in shlex.split(m.group(1)) if not t.startswith("-")]
    assert pip_args, "no pip install found"
    unpinned = [t for t in pip_args if not re.fullmatch(r"[A-Za-z0-9_.\[\],-]+==[A-Za-z0-9_.+!-]+", t)]
    assert not unpinned, f"unpinned requirements: {unpinned}"
    names = {t.split("==")[0].lower() for t in pip_args}
    assert {"vllm", "trl", "torch"} <= names

    # one image for every architecture: the arch list covers Volta..Blackwell with PTX on top
    env_text = " ".join(a for k, a, _ in instrs if k == "ENV")
    arch = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', env_text)
    assert arch and "8.0" in arch[1] and "9.0" in arch[1] and arch[1].endswith("+PTX")


def test_swe_task_containerfile_parses(images_mod):
    template = SWE_TASK_CONTAINERFILE.read_text()
    assert "@@BASE_IMAGE@@" in template and "ARG" not in [k for k, _, _ in parse_containerfile(
        template.replace("@@BASE_IMAGE@@", "x:1"))]
    filled = images_mod._fill_task_containerfile("demo", "0" * 64)
    assert not re.search(r"@@[A-Z_]+@@", filled)
    instrs = parse_containerfile(filled)
    assert instrs[0] == ("FROM", images_mod.SWE_BASE_IMAGE, instrs[0][2])
    # one COPY and one RUN: squashed into the single layer on top of swe-base
    assert [k for k, _, _ in instrs].count("COPY") == 1
    assert [k for k, _, _ in instrs].count("RUN") == 1
    label = next(a for k, a, _ in instrs if k == "LABEL")
    assert 'io.flowmesh.image="swe-task"' in label and 'io.flowmesh.task="demo"' in label


# --------------------------------------------------------------------------- #
# (b) entrypoint.py argument handling (subprocess, --dry-run, fake GPU env)
# --------------------------------------------------------------------------- #

@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


def _fake_nvidia_smi(bin_dir: Path, gpus: int) -> None:
    lines = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d}-aaaa-bbbb-cccc-000000000000)"
             for i in range(gpus)]
    if gpus:
        lines.insert(1, "  MIG 1g.10gb     Device  0: (UUID: MIG-00000000-0000-0000-0000-000000000000)")
    script = bin_dir / "nvidia-smi"
    # printf is a shell builtin: PATH holds only the fake tools
    script.write_text("#!/bin/sh\n[ \"$1\" = -L ] || exit 9\nprintf '%s\\n' "
                      + " ".join(shlex.quote(ln) for ln in lines) + "\n")
    script.chmod(0o755)


def run_ep(args: list[str], *, cvd: str | None = None, bin_dir: Path | None = None,
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir) if bin_dir else "/nonexistent", "LANG": "C.UTF-8"}
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    env.update(extra_env or {})
    return subprocess.run([sys.executable, str(ENTRYPOINT), *args], env=env,
                          capture_output=True, text=True, timeout=60)


def dry(args: list[str], **kw) -> list[str]:
    res = run_ep([*args, "--dry-run"] if "--" not in args else
                 [*args[:args.index("--")], "--dry-run", *args[args.index("--"):]], **kw)
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip().splitlines()
    assert len(out) == 1, res.stdout
    return shlex.split(out[0])


def test_serve_auto_uses_cuda_visible_devices():
    argv = dry(["serve", "--model", "Qwen/Qwen2.5-7B-Instruct"], cvd="0,1,2,3")
    assert argv == ["vllm", "serve", "Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8000",
                    "--tensor-parallel-size", "4"]
    # UUIDs count too; CUDA stops at the first invalid entry
    assert dry(["serve", "--model", "m"], cvd="GPU-aaa,GPU-bbb")[-1] == "2"
    assert dry(["serve", "--model", "m"], cvd="0,1,-1,3")[-1] == "2"


def test_serve_all_options_and_passthrough():
    argv = dry(["serve", "--model", "/models/llama", "--tensor-parallel", "2", "--num-heads", "32",
                "--port", "9001", "--max-model-len", "8192", "--gpu-memory-utilization", "0.85",
                "--served-model-name", "llama", "--", "--enable-prefix-caching", "--seed", "1"],
               cvd="0,1,2,3")
    assert argv == ["vllm", "serve", "/models/llama", "--host", "0.0.0.0", "--port", "9001",
                    "--tensor-parallel-size", "2", "--max-model-len", "8192",
                    "--gpu-memory-utilization", "0.85", "--served-model-name", "llama",
                    "--enable-prefix-caching", "--seed", "1"]


def test_serve_auto_falls_back_to_nvidia_smi(fake_bin):
    _fake_nvidia_smi(fake_bin, 2)
    argv = dry(["serve", "--model", "m", "--num-heads", "32"], bin_dir=fake_bin)
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"


@pytest.mark.parametrize("args, cvd, needle", [
    (["--tensor-parallel", "3", "--num-heads", "32"], "0,1,2,3",
     "argument --tensor-parallel: 3 does not divide --num-heads 32; allowed: 1, 2, 4"),
    (["--num-heads", "32"], "0,1,2", "argument --tensor-parallel: auto resolved to 3"),
    (["--tensor-parallel", "8"], "0,1,2,3", "argument --tensor-parallel: 8 is more than the 4 visible GPU"),
    ([], None, "argument --tensor-parallel: auto cannot count the GPUs"),
    ([], "", "argument --tensor-parallel: auto found no visible GPU"),
    (["--tensor-parallel", "two"], "0", "argument --tensor-parallel: invalid value 'two' (allowed: auto or a positive integer)"),
    (["--tensor-parallel", "0"], "0", "argument --tensor-parallel: invalid value '0'"),
    (["--port", "70000"], "0", "argument --port: invalid value '70000' (allowed: 1 to 65535)"),
    (["--gpu-memory-utilization", "1.5"], "0", "argument --gpu-memory-utilization: invalid value '1.5'"),
    (["--max-model-len", "-5"], "0", "argument --max-model-len: invalid value '-5'"),
    (["--num-heads", "x"], "0", "argument --num-heads: invalid value 'x'"),
])
def test_serve_bad_arguments_exit_2_naming_the_argument(args, cvd, needle):
    res = run_ep(["serve", "--model", "m", *args, "--dry-run"], cvd=cvd)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert needle in res.stderr, res.stderr
    assert res.stdout == ""


def test_serve_model_is_required():
    res = run_ep(["serve", "--dry-run"], cvd="0")
    assert res.returncode == 2 and "--model" in res.stderr


@pytest.mark.parametrize("recipe", ["sft", "dpo", "grpo"])
def test_train_recipes_map_to_trl(recipe, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    extra = ["--reward-funcs", "accuracy_reward", "think_format_reward"] if recipe == "grpo" else []
    argv = dry(["train", "--recipe", recipe, "--model", "Qwen/Qwen2.5-0.5B", "--dataset", str(data),
                "--output", str(tmp_path / "out"), "--max-steps", "10", *extra], cvd="0,1")
    expected = ["accelerate", "launch", "--num_processes", "2", "--num_machines", "1", "--multi_gpu",
                "--dynamo_backend", "no", "-m", f"trl.scripts.{recipe}",
                "--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", str(data),
                "--output_dir", str(tmp_path / "out"), "--max_steps", "10"]
    if recipe == "grpo":
        expected += ["--reward_funcs", "accuracy_reward", "think_format_reward"]
    assert argv == expected


def test_train_single_gpu_hub_dataset_vllm_and_passthrough(fake_bin):
    _fake_nvidia_smi(fake_bin, 1)
    argv = dry(["train", "--recipe", "grpo", "--model", "m", "--dataset", "trl-lib/DeepMath-103K",
                "--output", "/out", "--reward-funcs", "accuracy_reward", "--use-vllm",
                "--", "--learning_rate", "1e-6"], bin_dir=fake_bin)
    assert argv[:6] == ["accelerate", "launch", "--num_processes", "1", "--num_machines", "1"]
    assert "--multi_gpu" not in argv
    assert argv[argv.index("-m") + 1] == "trl.scripts.grpo"
    assert argv[-5:] == ["--use_vllm", "--vllm_mode", "colocate", "--learning_rate", "1e-6"]
    assert argv[argv.index("--dataset_name") + 1] == "trl-lib/DeepMath-103K"


def test_train_bad_arguments(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    f = data / "train.jsonl"
    f.write_text("{}\n")
    base = ["train", "--model", "m", "--output", "/out", "--dry-run"]
    cases = [
        (["--recipe", "ppo", "--dataset", str(data)],
         "argument --recipe: invalid choice: 'ppo' (choose from 'sft', 'dpo', 'grpo')"),
        (["--recipe", "grpo", "--dataset", str(data)], "argument --reward-funcs: required with --recipe grpo"),
        (["--recipe", "sft", "--dataset", str(data), "--reward-funcs", "x"],
         "argument --reward-funcs: only allowed with --recipe grpo"),
        (["--recipe", "dpo", "--dataset", str(data), "--use-vllm"], "argument --use-vllm: only allowed"),
        (["--recipe", "sft", "--dataset", str(f)], "argument --dataset: " + str(f) + " is a file"),
        (["--recipe", "sft", "--dataset", str(tmp_path / "missing")], "argument --dataset: "),
        (["--recipe", "sft", "--dataset", str(data), "--num-processes", "4"],
         "argument --num-processes: 4 is more than the 2 visible GPU"),
        (["--recipe", "sft", "--dataset", str(data), "--max-steps", "0"], "argument --max-steps: invalid value '0'"),
    ]
    for args, needle in cases:
        res = run_ep([*base, *args], cvd="0,1")
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert needle in res.stderr, (args, res.stderr)


def test_exec_really_execs_and_health(tmp_path, fake_bin):
    """Without --dry-run the entrypoint execs the command (a fake vllm here), writes its
    state file, and `health` then asks GET /health on the port serve used."""
    out = tmp_path / "argv.txt"
    fake_vllm = fake_bin / "vllm"
    fake_vllm.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > {shlex.quote(str(out))}\nexit 7\n")
    fake_vllm.chmod(0o755)
    state = tmp_path / "state.json"
    env = {"FLOWMESH_WORKER_STATE": str(state)}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    port = srv.server_address[1]
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        res = run_ep(["serve", "--model", "m", "--port", str(port)], cvd="0", bin_dir=fake_bin,
                     extra_env=env)
        assert res.returncode == 7, res.stderr  # the exit status of the exec'd program
        assert out.read_text().split("\n")[1:4] == ["serve", "m", "--host"]
        assert json.loads(state.read_text()) == {"mode": "serve", "port": port}
        assert run_ep(["health"], extra_env=env).returncode == 0
    finally:
        srv.shutdown()
        srv.server_close()
    bad = run_ep(["health", "--timeout", "2"], extra_env=env)
    assert bad.returncode == 1 and f"127.0.0.1:{port}/health" in bad.stderr
    # a training container has no server: always healthy
    state.write_text(json.dumps({"mode": "train", "recipe": "sft"}))
    assert run_ep(["health"], extra_env=env).returncode == 0
    # the program missing from PATH: 127
    res = run_ep(["serve", "--model", "m"], cvd="0", extra_env=env)
    assert res.returncode == 127 and "vllm not found" in res.stderr


# --------------------------------------------------------------------------- #
# registry / TLS rules (no podman needed)
# --------------------------------------------------------------------------- #

def test_registry_parsing_and_tls_rules(images_mod):
    m = images_mod
    for reg in ("127.0.0.1:5000", "127.8.9.10:1", "localhost:5000", "LOCALHOST", "[::1]:5000"):
        assert m.is_loopback_registry(reg), reg
        assert m.resolve_tls_verify(reg) is False
        assert m.resolve_tls_verify(reg, False) is False
        assert m.resolve_tls_verify(reg, True) is True
    for reg in ("10.0.0.1:5000", "192.168.1.2:5000", "128.0.0.1:5000", "registry.example.com:443",
                "localhost.example.com:5000", "[2001:db8::1]:5000"):
        assert not m.is_loopback_registry(reg), reg
        assert m.resolve_tls_verify(reg) is True
        with pytest.raises(m.ImageBuildError, match="refusing --tls-verify=false"):
            m.resolve_tls_verify(reg, False)
    assert m.parse_registry("registry.example.com:5000/team") == ("registry.example.com", 5000)
    for bad in ("", "http://127.0.0.1:5000", "127.0.0.1:99999", "a b:1", "host:port"):
        with pytest.raises(m.ImageBuildError):
            m.parse_registry(bad)


def test_cli_refuses_insecure_push_to_remote_host_before_building(images_mod, capsys):
    rc = images_mod.main(["push", "10.1.2.3:5000", "busybox", "--tls-verify", "false"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "refusing --tls-verify=false for registry '10.1.2.3:5000'" in err
    assert "building" not in err and "pushing" not in err
    rc = images_mod.main(["--push", "http://127.0.0.1:5000"])
    assert rc == 1 and "without a scheme" in capsys.readouterr().err


def test_task_repo_digest_is_content_only(images_mod):
    a = {"m.py": b"x = 1\n", "tests/test_m.py": b"def test(): pass\n"}
    b = dict(reversed(list(a.items())))
    assert images_mod.task_repo_digest(a) == images_mod.task_repo_digest(b)
    assert images_mod.task_repo_digest({**a, "m.py": b"x = 2\n"}) != images_mod.task_repo_digest(a)
    assert images_mod.task_repo_digest({"./m.py": b"x = 1\n", "tests/test_m.py": a["tests/test_m.py"]}) \
        == images_mod.task_repo_digest(a)
    for bad, needle in (({}, "empty"), ({"/abs.py": b""}, "relative"), ({"../x": b""}, "relative"),
                        ({".git/config": b""}, ".git"), ({"a": b"", "a/b": b""}, "both a file"),
                        ({"m.py": "text"}, "bytes")):
        with pytest.raises(images_mod.ImageBuildError, match=needle):
            images_mod.task_repo_digest(bad)
    for name in ("Upper", "a/b", "-x", "x--", ""):
        with pytest.raises(images_mod.ImageBuildError, match="bad task name"):
            images_mod.task_image_ref(name, "t")
    with pytest.raises(images_mod.ImageBuildError, match="bad tag"):
        images_mod.task_image_ref("ok", "-bad")


# --------------------------------------------------------------------------- #
# (c) + (d) a real task image build
# --------------------------------------------------------------------------- #

def _podman_json(*args: str):
    return json.loads(subprocess.run(["podman", *args], check=True, capture_output=True,
                                     text=True).stdout)


def _inspect(ref: str) -> dict:
    return _podman_json("image", "inspect", ref)[0]


def _repo_files(marker: str) -> dict[str, bytes]:
    return {
        "calc.py": b'"""Calculator."""\n\n\ndef add(a, b):\n    return a - b\n',
        "tests/test_calc.py": (f"# {marker}\nfrom calc import add\n\n\n"
                               "def test_add():\n    assert add(2, 3) == 5\n").encode(),
    }


@pytest.fixture
def task_image(images_mod, swe_image):
    """A freshly built task image (unique content, so the first call really builds)."""
    files = _repo_files(f"run {uuid.uuid4().hex}")
    t0 = time.monotonic()
    ref = images_mod.build_task_image("defs-test", files)
    build_s = time.monotonic() - t0
    yield ref, files, build_s
    subprocess.run(["podman", "image", "rm", "--force", ref], capture_output=True)


@pytest.mark.slow
def test_build_task_image_commits_repo_and_is_cached(images_mod, swe_image, task_image):
    ref, files, build_s = task_image
    digest = images_mod.task_repo_digest(files)
    assert ref == f"localhost/flowmesh/swe-task-defs-test:{digest[:12]}"
    info = _inspect(ref)
    labels = info["Config"]["Labels"]
    assert labels["io.flowmesh.image"] == "swe-task"
    assert labels["io.flowmesh.task"] == "defs-test"
    assert labels["io.flowmesh.repo-digest"] == digest
    assert info["Config"]["WorkingDir"] == "/work/repo"
    print(f"\n[timing] first build_task_image: {build_s:.2f}s")

    flags = [*images_mod.podman_runtime_args(), *images_mod.podman_run_ulimit_args()]
    res = subprocess.run(["podman", "run", "--rm", "--network", "none", *flags, ref, "sh", "-c",
                          "cd /work/repo && git log --oneline | wc -l && ls"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "calc.py", "tests"]

    # everything is committed, and the commit id depends on the content only
    res = subprocess.run(["podman", "run", "--rm", "--network", "none", *flags, ref, "sh", "-c",
                          "git ls-files && git status --porcelain && git log -1 --format=%an/%ad "
                          "--date=unix && git branch --show-current"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["calc.py", "tests/test_calc.py", "flowmesh/946684800", "main"]

    # what a sandbox then does: apply a patch and run pytest (no repo files shipped)
    patch = ("--- a/calc.py\n+++ b/calc.py\n@@ -2,4 +2,4 @@\n \n \n def add(a, b):\n"
             "-    return a - b\n+    return a + b\n")
    script = ("python3 -m pytest -q -p no:cacheprovider >/dev/null && exit 3; "
              "git apply - && python3 -m pytest -q -p no:cacheprovider")
    res = subprocess.run(["podman", "run", "--rm", "-i", "--network", "none", *flags,
                          "-e", "PYTHONDONTWRITEBYTECODE=1", ref, "sh", "-c", script],
                         input=patch, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed" in res.stdout

    # the same repo again: the same tag, no rebuild (image id and creation time unchanged)
    t0 = time.monotonic()
    again = images_mod.build_task_image("defs-test", dict(reversed(list(files.items()))))
    cached_s = time.monotonic() - t0
    print(f"[timing] second build_task_image (cached): {cached_s:.3f}s")
    assert again == ref
    info2 = _inspect(ref)
    assert info2["Id"] == info["Id"] and info2["Created"] == info["Created"]


@pytest.mark.slow
def test_task_image_is_swe_base_plus_one_layer(swe_image, task_image):
    ref, _, _ = task_image
    base_layers = _inspect(swe_image)["RootFS"]["Layers"]
    task_layers = _inspect(ref)["RootFS"]["Layers"]
    assert len(task_layers) == len(base_layers) + 1
    assert task_layers[:-1] == base_layers


@pytest.mark.slow
def test_cli_task_subcommand(images_mod, swe_image, tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "m.py").write_text(f"# {uuid.uuid4().hex}\n")
    (repo / ".git").mkdir()  # skipped
    (repo / ".git" / "HEAD").write_text("junk\n")
    name = f"cli-test-{uuid.uuid4().hex[:8]}"  # unique: parallel runs must not share it
    ref = f"localhost/flowmesh/swe-task-{name}:v1"
    try:
        assert images_mod.main(["task", name, str(repo), "--tag", "v1"]) == 0
        assert capsys.readouterr().out.strip() == ref
        assert ref in images_mod.list_task_images()
        flags = [*images_mod.podman_runtime_args(), *images_mod.podman_run_ulimit_args()]
        res = subprocess.run(["podman", "run", "--rm", "--network", "none", *flags, ref, "git", "ls-files"],
                             capture_output=True, text=True, timeout=60)
        assert res.stdout.split() == ["pkg/m.py"], res.stderr
    finally:
        subprocess.run(["podman", "image", "rm", "--force", ref], capture_output=True)


# --------------------------------------------------------------------------- #
# push to a loopback registry: a second task image adds only its own layer
# --------------------------------------------------------------------------- #

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registry(tmp_path):
    exe = shutil.which("docker-registry")
    if exe is None:
        pytest.skip("docker-registry is not installed (apt-get install -y docker-registry)")
    port = _free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(f"version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n"
                   f"storage:\n  filesystem:\n    rootdirectory: {tmp_path / 'reg'}\n"
                   f"http:\n  addr: 127.0.0.1:{port}\n")
    log = tmp_path / "registry.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"registry did not start: {log.read_text()[-500:]}")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}", log
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _manifest(registry: str, repo: str, tag: str) -> dict:
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": ", ".join([
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json"])})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


@pytest.mark.slow
def test_push_and_second_task_image_pulls_one_layer(images_mod, swe_image, registry, tmp_path):
    reg, log = registry
    run_id = uuid.uuid4().hex[:8]
    refs = [images_mod.build_task_image(f"push-test-{i}", _repo_files(f"{run_id}-{i}")) for i in (1, 2)]
    pushed: list[tuple[str, str]] = []
    # podman refuses a runroot longer than 50 characters: keep the store path short
    store = Path(tempfile.mkdtemp(prefix="fm-pull-", dir="/tmp" if os.path.isdir("/tmp") else None))
    pod: list[str] = []
    try:
        t0 = time.monotonic()
        for ref in (swe_image, *refs):
            pushed.append((ref, images_mod.push(ref, reg)))
        print(f"\n[timing] push swe-base + 2 task images: {time.monotonic() - t0:.1f}s")
        assert pushed[0][1] == f"{reg}/flowmesh/swe-base:bookworm"
        # the registry names that push() leaves in local storage are not task images to list
        listed = images_mod.list_task_images()
        assert set(refs) <= set(listed) and not any(r.startswith(reg) for r in listed)

        base_m = _manifest(reg, "flowmesh/swe-base", "bookworm")
        task_ms = [_manifest(reg, *t.split("/", 1)[1].rsplit(":", 1)) for _, t in pushed[1:]]
        base_digests = [layer["digest"] for layer in base_m["layers"]]
        for m in task_ms:
            digests = [layer["digest"] for layer in m["layers"]]
            assert digests[:-1] == base_digests  # the same blobs, stored once
            assert m["layers"][-1]["size"] < 1_000_000  # the task layer is small

        # pull both into an empty store; the second pull fetches only its own blobs
        driver = subprocess.run(["podman", "info", "--format", "{{.Store.GraphDriverName}}"],
                                capture_output=True, text=True).stdout.strip() or "vfs"
        pod = ["podman", "--root", str(store / "root"), "--runroot", str(store / "run"),
               "--storage-driver", driver]
        first = pushed[1][1]
        second = pushed[2][1]
        res = subprocess.run([*pod, "pull", "-q", "--tls-verify=false", first],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        offset = log.stat().st_size
        t0 = time.monotonic()
        res = subprocess.run([*pod, "pull", "-q", "--tls-verify=false", second],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        print(f"[timing] pull of the second task image (base layer already local): "
              f"{time.monotonic() - t0:.2f}s")
        time.sleep(0.2)
        with open(log, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        fetched = set(re.findall(r'"GET /v2/[^ ]+/blobs/(sha256:[0-9a-f]{64}) HTTP', text))
        m2 = task_ms[1]
        assert fetched == {m2["config"]["digest"], m2["layers"][-1]["digest"]}, text[-2000:]
    finally:
        for src, target in pushed:
            subprocess.run(["podman", "untag", src, target], capture_output=True)
        for ref in refs:
            subprocess.run(["podman", "image", "rm", "--force", ref], capture_output=True)
        if pod:
            subprocess.run([*pod, "system", "reset", "--force"], capture_output=True)
        shutil.rmtree(store, ignore_errors=True)
