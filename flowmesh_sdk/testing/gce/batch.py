"""The batch endpoint of the Compute Engine emulator (``POST /batch/compute/v1``)."""

from __future__ import annotations

import email.parser
import email.policy
import urllib.parse
import uuid

import aiohttp
from aiohttp import web

from .wire import error


async def serve_batch(url: str, request: web.Request) -> web.StreamResponse:
    """The batch endpoint (``multipart/mixed`` of ``application/http`` parts, as gcloud
    sends a multi-zone list or a multi-name delete): each part served by this emulator,
    over loopback (``url``: the emulator's), and answered as a part with ``Content-ID: <response-ID>``."""
    ctype = request.headers.get("Content-Type", "")
    raw = await request.read()
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + raw)
    if not msg.is_multipart():
        return error(400, "invalid", "A batch request must be multipart/mixed.")
    boundary = f"batch_{uuid.uuid4().hex}"
    out: list[bytes] = []
    async with aiohttp.ClientSession() as http:
        for part in msg.iter_parts():
            payload = part.get_payload(decode=True)
            inner = payload if isinstance(payload, bytes) else b""
            head, _, body = inner.replace(b"\r\n", b"\n").partition(b"\n\n")
            lines = head.decode("utf-8", "replace").split("\n")
            method, target = lines[0].split(" ")[:2]
            parts = urllib.parse.urlsplit(target)
            path = parts.path + (f"?{parts.query}" if parts.query else "")
            headers = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ":" in ln)
                       if k.strip().lower() in ("content-type", "authorization")}
            async with http.request(method, url + path, data=body or None, headers=headers) as resp:
                answer = await resp.read()
                status = f"{resp.status} {resp.reason}"
            cid = str(part.get("Content-ID", "")).strip("<>")
            out.append((f"--{boundary}\r\nContent-Type: application/http\r\n"
                        f"Content-ID: <response-{cid}>\r\n\r\n"
                        f"HTTP/1.1 {status}\r\nContent-Type: application/json; charset=UTF-8\r\n"
                        f"Content-Length: {len(answer)}\r\n\r\n").encode() + answer + b"\r\n")
    payload = b"".join(out) + f"--{boundary}--\r\n".encode()
    return web.Response(status=200, body=payload,
                        headers={"Content-Type": f"multipart/mixed; boundary={boundary}"})
