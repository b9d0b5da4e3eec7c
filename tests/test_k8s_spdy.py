"""SPDY/3 framing (flowmesh_sdk.testing.k8s.spdy) and the k8s emulator's SPDY port-forward session
(flowmesh_sdk.testing.k8s.portforward_spdy) served over a real WebSocket by an aiohttp server, its
"pod" a TCP server on 127.0.0.1.  kubectl itself is driven against the emulator in
tests/providers/test_k8s_workers.py."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import zlib

import aiohttp
import pytest
from aiohttp import web

from flowmesh_sdk.testing.httpserver import HttpServer
from flowmesh_sdk.testing.k8s import spdy
from flowmesh_sdk.testing.k8s.portforward import SPDY_TUNNEL
from flowmesh_sdk.testing.k8s.portforward_spdy import serve_spdy_portforward
from flowmesh_sdk.testing.k8s.spdy import (FLAG_FIN, Data, FrameReader, FrameWriter, GoAway, Headers, Ping,
                                           RstStream, Settings, SynReply, SynStream, WindowUpdate)


def test_the_dictionary_is_the_specs():
    # draft-mbelshe-httpbis-spdy-00 2.6.10.1: 1423 bytes; its adler32 is the DICTID on the wire
    assert len(spdy.DICTIONARY) == 1423
    assert zlib.adler32(spdy.DICTIONARY) == 0xE3C6A7C2
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest() == \
        "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"   # moby/spdystream's headerDictionary
    assert spdy.DICTIONARY.startswith(b"\x00\x00\x00\x07options\x00\x00\x00\x04head")
    assert spdy.DICTIONARY.endswith(b"charset=iso-8859-1,utf-,*,enq=0.")


def test_frames_round_trip():
    frames = [SynStream(1, {"streamtype": ["error"], "port": ["8000"], "requestid": ["0"]}, 0, 0, 2, 0),
              SynReply(1), SynReply(3, {"a": ["x", "y"]}, FLAG_FIN), Headers(3, {"k": ["v"]}), RstStream(5, 5),
              Settings(((0, 4, 100), (1, 7, 65536))), Ping(1), GoAway(7, 0), WindowUpdate(0, 1 << 20),
              Data(3, b"hello"), Data(3, b"", FLAG_FIN), Data(0x7FFFFFFF, bytes(range(256)) * 300)]
    writer, reader = FrameWriter(), FrameReader()
    wire = b"".join(writer.encode(f) for f in frames)
    assert reader.feed(wire) == frames
    # byte by byte: a frame spread over many feeds comes out once, whole
    writer, reader = FrameWriter(), FrameReader()
    wire = b"".join(writer.encode(f) for f in frames)
    out = [f for i in range(len(wire)) for f in reader.feed(wire[i:i + 1])]
    assert out == frames


def test_wire_layout():
    w = FrameWriter()
    assert w.encode(Ping(7)) == bytes.fromhex("80030006 00000004 00000007")
    assert w.encode(RstStream(3, 3)) == bytes.fromhex("80030003 00000008 00000003 00000003")
    assert w.encode(GoAway(5, 1)) == bytes.fromhex("80030007 00000008 00000005 00000001")
    assert w.encode(WindowUpdate(1, 65536)) == bytes.fromhex("80030009 00000008 00000001 00010000")
    assert w.encode(Data(3, b"ab", FLAG_FIN)) == bytes.fromhex("00000003 01000002 6162")
    reply = w.encode(SynReply(1))
    assert reply[:4] == bytes.fromhex("80030002") and int.from_bytes(reply[5:8], "big") == len(reply) - 8
    assert reply[8:12] == bytes.fromhex("00000001")
    block = reply[12:]   # a zlib stream preset with the dictionary: FDICT and its DICTID, ended by a sync flush
    assert block[1] & 0x20 and block[2:6] == (0xE3C6A7C2).to_bytes(4, "big") and block.endswith(b"\x00\x00\xff\xff")
    assert spdy.encode_header_block({"Port": "8000", "x": ["1", "2"]}) == \
        b"\0\0\0\2" b"\0\0\0\4port" b"\0\0\0\x048000" b"\0\0\0\1x" b"\0\0\0\x031\x002"


def test_header_blocks_share_one_context_per_direction():
    headers = {"streamtype": ["data"], "port": ["8000"], "requestid": ["12"]}
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    first = deflate.compress(spdy.encode_header_block(headers)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    second = deflate.compress(spdy.encode_header_block(headers)) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert len(second) < len(first)   # the second block refers back to the first, in the same stream
    inflate = zlib.decompressobj(zdict=spdy.DICTIONARY)
    assert spdy.decode_header_block(inflate.decompress(first)) == headers
    assert spdy.decode_header_block(inflate.decompress(second)) == headers
    # the framer's two frames: the second only decodes after the first, in one context
    writer = FrameWriter()
    a, b = writer.encode(SynStream(1, headers)), writer.encode(SynStream(3, headers))
    assert FrameReader().feed(a + b) == [SynStream(1, headers), SynStream(3, headers)]
    with pytest.raises(ValueError):
        FrameReader().feed(b)   # a fresh context cannot read a block that refers to an earlier one


def test_malformed_frames_are_refused():
    with pytest.raises(ValueError, match="version"):
        FrameReader().feed(bytes.fromhex("80020006 00000004 00000001"))
    with pytest.raises(ValueError, match="unknown"):
        FrameReader().feed(bytes.fromhex("80030005 00000000"))   # NOOP is SPDY/2 only
    with pytest.raises(ValueError):
        spdy.decode_header_block(b"\0\0\0\2\0\0\0\1a\0\0\0\0")
    assert FrameReader().feed(bytes.fromhex("80030006 00000004 0000")) == []   # not whole yet


# --------------------------------------------------------------------------- #
# the port-forward session over a real WebSocket
# --------------------------------------------------------------------------- #

class _Tunnel(HttpServer):
    def __init__(self, connect) -> None:
        super().__init__()
        self._connect = connect

    async def handle(self, request: web.Request) -> web.StreamResponse:
        return await serve_spdy_portforward(request, connect=self._connect, error_prefix=lambda p: f"pf {p}",
                                            stream_timeout_s=1.0)


class _Client:
    """A SPDY client over the tunnel, as client-go's TunnelingConnection + spdystream use it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.writer, self.reader, self.frames = ws, FrameWriter(), FrameReader(), []

    async def send(self, *frames) -> None:
        for f in frames:
            await self.ws.send_bytes(self.writer.encode(f))

    async def until(self, predicate, timeout_s: float = 10.0):
        async def loop():
            while True:
                for i, f in enumerate(self.frames):
                    if predicate(f):
                        return self.frames.pop(i)
                msg = await self.ws.receive()
                assert msg.type == aiohttp.WSMsgType.BINARY, msg
                self.frames += self.reader.feed(msg.data)
        return await asyncio.wait_for(loop(), timeout_s)

    async def stream_bytes(self, sid: int) -> bytes:
        out = b""
        while True:
            f = await self.until(lambda f: isinstance(f, Data) and f.stream_id == sid)
            out += f.data
            if f.fin:
                return out


def _pf(kind: str, port: int, rid: str) -> dict:
    return {"streamtype": [kind], "port": [str(port)], "requestid": [rid]}


async def test_session_pairs_streams_and_relays_both_ways():
    async def echo(reader, writer):
        data = await reader.read()   # until the half-close the client's FIN makes
        writer.write(b"got:" + data)
        await writer.drain()
        writer.close()

    pod = await asyncio.start_server(echo, "127.0.0.1", 0)
    pod_port = pod.sockets[0].getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()

    async def connect(port: int) -> socket.socket:
        target = pod_port if port == 8000 else refused_port
        return await asyncio.to_thread(socket.create_connection, ("127.0.0.1", target), 5)

    async with _Tunnel(connect) as server, aiohttp.ClientSession() as http:
        async with http.ws_connect(server.url, protocols=[SPDY_TUNNEL]) as ws:
            assert ws.protocol == SPDY_TUNNEL
            c = _Client(ws)
            await c.send(Ping(1))
            assert await c.until(lambda f: isinstance(f, Ping)) == Ping(1)
            for rid in ("0", "1"):   # two connections, one after the other, each a new pair
                err, data = 4 * int(rid) + 1, 4 * int(rid) + 3
                await c.send(SynStream(err, _pf("error", 8000, rid)), Data(err, b"", FLAG_FIN))
                assert await c.until(lambda f: isinstance(f, SynReply) and f.stream_id == err) == SynReply(err)
                await c.send(SynStream(data, _pf("data", 8000, rid)))
                await c.until(lambda f: isinstance(f, SynReply) and f.stream_id == data)
                await c.send(Data(data, b"hello " + rid.encode()), Data(data, b"", FLAG_FIN))
                assert await c.stream_bytes(data) == b"got:hello " + rid.encode()
                assert await c.stream_bytes(err) == b""
            # a port nothing listens on: the forwarder's error on the error stream, then FIN on both
            await c.send(SynStream(9, _pf("error", 8001, "2")), SynStream(11, _pf("data", 8001, "2")))
            text = (await c.stream_bytes(9)).decode()
            assert text.startswith("pf 8001: ") and "refused" in text.lower(), text
            assert await c.stream_bytes(11) == b""
            # a stream without a port is reset; a pair never completed times out on its error stream
            await c.send(SynStream(13, {"streamtype": ["data"]}))
            assert await c.until(lambda f: isinstance(f, RstStream)) == RstStream(13, spdy.CANCEL)
            await c.send(SynStream(15, _pf("error", 8000, "3")))
            assert (await c.stream_bytes(15)).endswith("request=3) timed out waiting for streams".encode())
            # GOAWAY: new streams refused, and the session ends (nothing is left open)
            await c.send(GoAway(15))
            msg = await asyncio.wait_for(ws.receive(), 10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING)
    pod.close()
    await pod.wait_closed()
