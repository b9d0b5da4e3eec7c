"""The process side of the local registry: the ``docker-registry`` binary, its config, the
launch on a loopback port and the wait until it answers, its logs, the provisioned
password, the auth file, and the stop (:class:`RegistryProcess`, the part of
:class:`~flowmesh_sdk.registry.local.LocalRegistry` that runs it, on the registry's shared
:class:`~.localbase.RegistryState`)."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import weakref
from typing import Any

from .localbase import LocalRegistryError, RegistryNotInstalled, RegistryState
from .localhttp import _http

_INSTALL_HINT = "apt-get install -y docker-registry"


class _PortTaken(Exception):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    except ProcessLookupError:
        pass


class RegistryProcess:
    """A LocalRegistry's ``docker-registry serve`` process (what it learns on start -- the
    port, the provisioned credentials -- goes to ``state``)."""

    def __init__(self, state: RegistryState) -> None:
        self.state = state
        self._proc: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize | None = None
        self._logs: list[Any] = []

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def binary(self) -> str:
        """The ``docker-registry`` to run; :class:`RegistryNotInstalled` without one."""
        if self.state.binary is not None:
            binary = shutil.which(self.state.binary)
        else:
            binary = shutil.which("docker-registry") or (
                "/usr/bin/docker-registry" if os.access("/usr/bin/docker-registry", os.X_OK) else None)
        if not binary:
            raise RegistryNotInstalled(
                f"docker-registry (distribution v2) is not installed: {_INSTALL_HINT}")
        return binary

    def _config(self, port: int, auth: dict[str, Any] | None) -> dict[str, Any]:
        config: dict[str, Any] = {
            "version": "0.1",
            "log": {"level": "info", "formatter": "json", "accesslog": {"disabled": False},
                    "fields": {"service": "flowmesh-test-registry"}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.state.storage_dir)},
                "delete": {"enabled": True},
                "maintenance": {"uploadpurging": {"enabled": False}},
            },
            "http": {"addr": f"127.0.0.1:{port}", "secret": secrets.token_hex(16),
                     "headers": {"X-Content-Type-Options": ["nosniff"]}},
            "health": {"storagedriver": {"enabled": False}},
        }
        if auth:
            config["auth"] = auth
        return config

    def launch(self, binary: str, port: int, auth: dict[str, Any] | None) -> None:
        """Start ``binary`` on ``port`` and wait until it answers (``_PortTaken``: in use)."""
        workdir = self.state.workdir
        config_path = workdir / "config.yml"
        # JSON is YAML: no quoting questions for paths or secrets.
        config_path.write_text(json.dumps(self._config(port, auth), indent=2) + "\n")
        os.chmod(config_path, 0o600)
        self._close_logs()
        out = open(workdir / "access.log", "wb")
        err = open(workdir / "registry.log", "wb")
        self._logs = [out, err]
        # REGISTRY_* variables would override the config file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        proc = subprocess.Popen([binary, "serve", str(config_path)], stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, env=env, start_new_session=True)
        self._proc = proc
        self.state.bound_port = port
        self._finalizer = weakref.finalize(self, _kill_process, proc)
        try:
            self._wait_ready(time.monotonic() + self.state.startup_timeout)
        except BaseException:
            _kill_process(proc)
            self._proc = None
            self.state.bound_port = None
            raise

    def _wait_ready(self, deadline: float) -> None:
        assert self._proc is not None
        url = f"http://127.0.0.1:{self.state.bound_port}/v2/"
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    raise _PortTaken()
                raise LocalRegistryError(f"docker-registry exited with {code}: {tail}")
            try:
                _http("GET", url, timeout=1.0)
                return   # any HTTP answer (200, 401) means it is serving
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise LocalRegistryError(f"docker-registry did not answer on {url} within "
                                    f"{self.state.startup_timeout:.0f}s: {self._log_tail()}")
            time.sleep(0.02)

    def _log_tail(self, n: int = 2000) -> str:
        try:
            text = (self.state.workdir / "registry.log").read_text(errors="replace")
        except OSError:
            return ""
        # Never echo a provisioned password.
        text = re.sub(r'"password":"[^"]*"', '"password":"***"', text)
        return text[-n:].strip()

    def read_provisioned_password(self) -> None:
        """The user and password distribution provisioned (no htpasswd file), from its log."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for line in self.state.log_path.read_text(errors="replace").splitlines():
                if "provisioning with default user" in line:
                    rec = json.loads(line)
                    self.state.username, self.state.password = rec["user"], rec["password"]
                    return
            time.sleep(0.02)
        raise LocalRegistryError("the registry did not provision an htpasswd user")

    def write_authfile(self) -> None:
        """The containers-auth.json podman is given (``state.authfile``)."""
        st = self.state
        assert st.username is not None and st.password is not None
        token = base64.b64encode(f"{st.username}:{st.password}".encode()).decode()
        path = st.workdir / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {st.host: {"auth": token}}}, f)

    def _close_logs(self) -> None:
        for f in self._logs:
            try:
                f.close()
            except OSError:
                pass
        self._logs = []

    def stop(self) -> None:
        """Kill the registry (and the token server); remove the temporary directories."""
        if self._proc is not None:
            _kill_process(self._proc)
            self._proc = None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        self._close_logs()
        st = self.state
        if st.token_server is not None:
            st.token_server.stop()
        if st.work is not None:
            shutil.rmtree(st.work, ignore_errors=True)
            st.work = None
        st.bound_port = None
