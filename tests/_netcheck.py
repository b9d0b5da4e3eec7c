"""Helpers of the egress tests (local sandboxes and k8s pods): the podman bridge's gateway
address (this host's side of the bridge, so no traffic leaves the machine), a throw-away
HTTP server on it, and a GET from inside a sandbox with busybox's ``nc``."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import threading


def gateway() -> str:
    out = subprocess.run(["podman", "network", "inspect", "podman"], check=True,
                         capture_output=True, text=True).stdout
    net = json.loads(out)[0]
    subnets = net.get("subnets") or net.get("Subnets") or []
    if subnets:
        return subnets[0]["gateway"]
    # CNI style (podman 3): plugins[0].ipam.ranges[0][0].gateway
    return net["plugins"][0]["ipam"]["ranges"][0][0]["gateway"]


@contextlib.contextmanager
def http_server(addr: str, word: str):
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


async def nc_get(sb, addr: str, port: int) -> str:
    """The body a GET returns, or '' (busybox nc; its wget crashes on this image)."""
    r = await sb.exec(f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {addr} {port} 2>&1", timeout_s=20)
    head, sep, body = r.stdout.partition("\r\n\r\n")
    return body if sep and head.startswith("HTTP/1.") else ""
