#!/usr/bin/env python3
"""FakeVllmServer -- a TEST FIXTURE standing in for vLLM's OpenAI-compatible server.

It is NOT vLLM and runs no model.  It answers the routes FlowMesh's inference role
uses, in the shapes vLLM's server gives them (see vLLM's "OpenAI-Compatible Server"
docs and the OpenAI API reference for ``/v1/completions`` and ``/v1/chat/completions``):

* ``GET /health``               200 with an empty body once "loaded", 503 when told unhealthy;
* ``GET /v1/models``            ``{"object": "list", "data": [{"id": NAME, "object": "model",
                                 "owned_by": "vllm", "root": MODEL, "max_model_len": N, ...}]}``;
* ``POST /v1/completions``      ``prompt`` a string or a list of strings (a batch); one choice
                                 per prompt (``n`` per prompt), ``index`` = prompt * n + j;
* ``POST /v1/chat/completions`` one conversation.

Each answer is a deterministic function of its input (``"ok:" + prompt``), so a test
can tell whose answer is whose.  Knobs a test sets: ``healthy``, ``delay_s`` (each
request waits that long), ``fail_status`` (answer every request with that HTTP
status); it records ``batch_sizes`` (prompts per completions request) and
``requests`` (path, FlowMesh headers, body).

Standard library only, so the same file also runs *inside a container* as the
stand-in for the ``vllm`` executable (``fake_vllm.py serve MODEL --host H --port P
--tensor-parallel-size N ...``).  In that mode it waits ``FAKE_VLLM_LOAD_S`` seconds
before it listens -- as the real server is unreachable while it loads weights --, makes
each request wait ``FAKE_VLLM_DELAY_S`` seconds (so a test can hold requests in flight), and
answers ``GET /fake/launch`` with the argv it was started with (a fixture-only route
that lets a test check the tensor-parallel size the launch path chose).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

#: headers the fixture records from each request (the SDK's locality headers)
RECORDED_HEADERS = ("x-flowmesh-worker", "x-flowmesh-g-loc", "x-flowmesh-model")


@dataclass
class RecordedRequest:
    """One request the fixture answered (for assertions)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any] = field(default_factory=dict)


def answer_text(prompt: str, j: int = 0, n: int = 1) -> str:
    """The fixture's deterministic "completion" of ``prompt`` (choice ``j`` of ``n``)."""
    return f"ok:{prompt}" if n == 1 else f"ok:{prompt}#{j}"


class FakeVllmServer:
    """FakeVllmServer: a TEST FIXTURE standing in for vLLM's OpenAI-compatible server.

    Start with :meth:`start` (or ``with FakeVllmServer(...) as srv``); ``srv.url`` is the
    base URL.  Serves on a thread, so both threaded and asyncio tests can use it.
    """

    def __init__(self, model: str = "fake/tiny-model", *, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str | None = None, max_model_len: int = 2048,
                 launch_argv: list[str] | None = None) -> None:
        self.model = model
        self.served_model_name = served_model_name or model
        self.max_model_len = max_model_len
        self.launch_argv = list(launch_argv or [])
        self.healthy = True
        self.delay_s = 0.0
        self.fail_status: int | None = None
        self.batch_sizes: list[int] = []
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._host, self._port = host, port
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.in_flight = 0
        self.max_in_flight = 0

    # ---- lifecycle ----------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("FakeVllmServer is not started")
        host, port = self._httpd.socket.getsockname()[:2]   # the server_address it bound
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("FakeVllmServer is not started")
        return int(self._httpd.server_address[1])

    def start(self) -> FakeVllmServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server((self._host, self._port), handler)
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # stop() does not wait for a slow request
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-vllm",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def serve_forever(self) -> None:
        """Script mode: serve on the calling thread until killed."""
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server((self._host, self._port), handler)
        self._httpd.daemon_threads = True
        self._httpd.serve_forever()

    def __enter__(self) -> FakeVllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- answers ------------------------------------------------------------------
    def _record(self, path: str, headers: Any, body: dict[str, Any]) -> None:
        kept = {k: headers[k] for k in RECORDED_HEADERS if headers.get(k) is not None}
        with self._lock:
            self.requests.append(RecordedRequest(path, kept, body))

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": self.served_model_name, "object": "model", "created": int(time.time()),
            "owned_by": "vllm", "root": self.model, "parent": None,
            "max_model_len": self.max_model_len}]}

    def completions(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        prompts = body.get("prompt")
        if isinstance(prompts, str):
            prompts = [prompts]
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            return 400, _error("prompt must be a string or a non-empty list of strings",
                               "BadRequestError", 400)
        n = int(body.get("n") or 1)
        with self._lock:
            self.batch_sizes.append(len(prompts))
        choices, used = [], 0
        for i, prompt in enumerate(prompts):
            for j in range(n):
                text = answer_text(prompt, j, n)
                used += len(text.split())
                choices.append({"index": i * n + j, "text": text, "logprobs": None,
                                "finish_reason": "stop", "stop_reason": None})
        seen = sum(len(p.split()) for p in prompts)
        return 200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                     "created": int(time.time()), "model": body.get("model"), "choices": choices,
                     "usage": {"prompt_tokens": seen, "completion_tokens": used,
                               "total_tokens": seen + used}}

    def chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return 400, _error("messages must be a non-empty list", "BadRequestError", 400)
        last = next((m.get("content", "") for m in reversed(msgs)
                     if isinstance(m, dict) and m.get("role") == "user"), "")
        text = answer_text(str(last))
        seen = sum(len(str(m.get("content", "")).split()) for m in msgs if isinstance(m, dict))
        used = len(text.split())
        return 200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                     "created": int(time.time()), "model": body.get("model"),
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": seen, "completion_tokens": used,
                               "total_tokens": seen + used}}


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A client that hung up (a caller's timeout, a drain's deadline) is no error of the
        server's: nothing printed.  Printing a traceback from a server thread is not only
        noise: this machine's CPython 3.11.7 can fail with "AST constructor recursion depth
        mismatch" when two threads parse source at once (a traceback's caret anchors do), and
        pytest formatting a failure at that moment died with INTERNALERROR (seen under load)."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]  # wider params than the stub


class _Handler(http.server.BaseHTTPRequestHandler):
    fake: FakeVllmServer
    protocol_version = "HTTP/1.1"
    server_version = "FakeVllmServer-TEST-FIXTURE"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict[str, Any] | None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        fake = self.fake
        if self.path == "/health":
            self._send(200 if fake.healthy else 503, None)
        elif self.path == "/v1/models":
            self._send(200, fake.models())
        elif self.path == "/fake/launch":
            self._send(200, {"argv": fake.launch_argv, "fixture": "FakeVllmServer"})
        else:
            self._send(404, _error(f"no route {self.path}", "NotFoundError", 404))

    def do_POST(self) -> None:  # noqa: N802
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._send(400, _error("body is not JSON", "BadRequestError", 400))
            return
        fake._record(self.path, self.headers, body)
        with fake._lock:
            fake.in_flight += 1
            fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
        try:
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if fake.fail_status is not None:
                self._send(fake.fail_status, _error("fixture told to fail", "FixtureError",
                                                    fake.fail_status))
                return
            if body.get("model") not in (fake.served_model_name,):
                self._send(404, _error(f"The model `{body.get('model')}` does not exist.",
                                       "NotFoundError", 404))
                return
            if self.path == "/v1/completions":
                self._send(*fake.completions(body))
            elif self.path == "/v1/chat/completions":
                self._send(*fake.chat(body))
            else:
                self._send(404, _error(f"no route {self.path}", "NotFoundError", 404))
        finally:
            with fake._lock:
                fake.in_flight -= 1


# --------------------------------------------------------------------------- #
# a stand-in worker image for container tests (TEST FIXTURE)
# --------------------------------------------------------------------------- #

STANDIN_REPO = "localhost/flowmesh/gpu-worker-standin"

_STANDIN_VLLM = """#!/bin/sh
# STAND-IN for the vllm executable (TEST FIXTURE): runs FakeVllmServer, not vLLM.
exec python3 /opt/flowmesh/fake_vllm.py "$@"
"""

_STANDIN_NVIDIA_SMI = """#!/bin/sh
# STAND-IN for nvidia-smi (TEST FIXTURE): lists $FAKE_GPUS made-up GPUs; there is no GPU here.
# With FAKE_GPUS unset it fails as nvidia-smi does on a machine without a driver.
[ "$1" = "-L" ] || { echo "stand-in nvidia-smi: only -L is supported" >&2; exit 9; }
[ -n "${FAKE_GPUS+set}" ] || { echo "NVIDIA-SMI has failed (stand-in: FAKE_GPUS is unset)"; exit 9; }
i=0
while [ "$i" -lt "${FAKE_GPUS:-0}" ]; do
  echo "GPU $i: FAKE GPU, stand-in (UUID: GPU-00000000-0000-0000-0000-00000000000$i)"
  i=$((i + 1))
done
"""

# The real accelerate CLI (what pip's console script does), for when the host's
# site-packages holding accelerate/TRL/torch is mounted and on PYTHONPATH.
_ACCELERATE_SHIM = """#!/usr/bin/python3
import sys
from accelerate.commands.accelerate_cli import main
sys.exit(main())
"""

_STANDIN_CONTAINERFILE = """FROM {base}
COPY entrypoint.py /opt/flowmesh/entrypoint.py
COPY fake_vllm.py /opt/flowmesh/fake_vllm.py
COPY vllm /usr/local/bin/vllm
COPY nvidia-smi /usr/local/bin/nvidia-smi
COPY accelerate /usr/local/bin/accelerate
LABEL io.flowmesh.image="gpu-worker-standin" io.flowmesh.test-fixture="true"
ENTRYPOINT ["python3", "/opt/flowmesh/entrypoint.py"]
"""


def build_standin_worker_image(entrypoint: str, *, base: str, build_args: list[str] | None = None,
                               podman: str = "podman") -> str:
    """Build (once; tagged by the hash of its inputs) a TEST FIXTURE image standing in for
    the GPU worker image: ``base`` (any image with python3) plus the REAL ``entrypoint.py``,
    a stand-in ``vllm`` (this file's FakeVllmServer), a stand-in ``nvidia-smi`` that lists
    ``$FAKE_GPUS`` made-up GPUs, and accelerate's console-script shim.  Returns its name."""
    import hashlib
    import shutil
    import subprocess
    import tempfile

    files = {
        "entrypoint.py": open(entrypoint, "rb").read(),
        "fake_vllm.py": open(__file__, "rb").read(),
        "vllm": _STANDIN_VLLM.encode(),
        "nvidia-smi": _STANDIN_NVIDIA_SMI.encode(),
        "accelerate": _ACCELERATE_SHIM.encode(),
        "Containerfile": _STANDIN_CONTAINERFILE.format(base=base).encode(),
    }
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    ref = f"{STANDIN_REPO}:{h.hexdigest()[:12]}"
    if subprocess.run([podman, "image", "exists", ref]).returncode == 0:
        return ref
    ctx = tempfile.mkdtemp(prefix="fm-standin-")
    try:
        for name, data in files.items():
            path = os.path.join(ctx, name)
            with open(path, "wb") as fh:
                fh.write(data)
            os.chmod(path, 0o755 if name in ("vllm", "nvidia-smi", "accelerate", "entrypoint.py",
                                             "fake_vllm.py") else 0o644)
        proc = subprocess.run([podman, "build", *(build_args or []), "-t", ref, "-f",
                               os.path.join(ctx, "Containerfile"), ctx],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"podman build {ref} failed: {proc.stdout[-2000:]}")
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    # older builds (from earlier versions of these files) are not needed any more
    old = subprocess.run([podman, "images", "--format", "{{.Repository}}:{{.Tag}}", STANDIN_REPO],
                         capture_output=True, text=True).stdout.split()
    for name in old:
        if name != ref:
            subprocess.run([podman, "rmi", name], capture_output=True)
    return ref


def main(argv: list[str] | None = None) -> int:
    """Script mode: ``fake_vllm.py serve MODEL [--host H] [--port P]
    [--tensor-parallel-size N] [--served-model-name NAME] [--max-model-len N] [...]``.
    Unknown vLLM flags are accepted and ignored (they are recorded for /fake/launch)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="vllm (FakeVllmServer TEST FIXTURE)")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-model-len", type=int, default=2048)
    args, _unknown = p.parse_known_args(argv)
    # as PID 1 of a container nothing ends us on SIGTERM unless we say so (vLLM does too)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    load_s = float(os.environ.get("FAKE_VLLM_LOAD_S", "0") or 0)
    print(f"FakeVllmServer (TEST FIXTURE, not vLLM): {args.model} tp={args.tensor_parallel_size}"
          f" loading for {load_s:g} s", flush=True)
    if load_s > 0:
        time.sleep(load_s)
    srv = FakeVllmServer(args.model, host=args.host, port=args.port,
                         served_model_name=args.served_model_name,
                         max_model_len=args.max_model_len, launch_argv=["vllm", *argv])
    srv.delay_s = float(os.environ.get("FAKE_VLLM_DELAY_S", "0") or 0)   # each request waits (a slow GPU)
    print(f"FakeVllmServer listening on {args.host}:{args.port}", flush=True)
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
