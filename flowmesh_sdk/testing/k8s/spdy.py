"""SPDY/3 framing (draft-mbelshe-httpbis-spdy-00, the SPDY/3 protocol draft, and its 3.1 revision, which
adds only the session-level WINDOW_UPDATE): what kubectl's ``port-forward`` speaks (client-go's
``httpstream/spdy`` over ``moby/spdystream``), for the k8s emulator's :mod:`.portforward_spdy`.

Frames (section 2.2), every field big-endian:

* control -- ``1 | version(15) | type(16)``, ``flags(8) | length(24)``, then ``length`` bytes of data;
* data -- ``0 | stream-id(31)``, ``flags(8) | length(24)``, then the payload; ``FLAG_FIN`` (0x01) ends the
  sender's half of the stream.

Control frame data (section 2.6): SYN_STREAM (1) ``stream-id(31) assoc-id(31) pri(3) unused(5) slot(8)
header-block``; SYN_REPLY (2) ``stream-id(31) header-block``; RST_STREAM (3) ``stream-id(31)
status(32)``; SETTINGS (4) ``count(32)`` then ``flags(8) id(24) value(32)`` each; PING (6) ``id(32)``;
GOAWAY (7) ``last-good-stream-id(31) status(32)``; HEADERS (8) ``stream-id(31) header-block``;
WINDOW_UPDATE (9) ``stream-id(31) delta(31)``.  A frame of another type is an error (spdystream's
framer has no NOOP or CREDENTIAL either).

Header blocks (section 2.6.10): ``count(32)`` then ``name-length(32) name value-length(32) value`` each,
names lowercase, several values of one name joined by NUL; the block is compressed with zlib, one
stream per direction kept across every frame of the session, each block ended with ``Z_SYNC_FLUSH``,
the stream preset with the dictionary of section 2.6.10.1 (:data:`DICTIONARY`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["CANCEL", "DICTIONARY", "FLAG_FIN", "FLAG_UNIDIRECTIONAL", "PROTOCOL_ERROR", "REFUSED_STREAM", "VERSION",
           "Data", "Frame", "FrameReader", "FrameWriter", "GoAway", "Headers", "HeaderBlock", "Ping", "RstStream",
           "Settings", "SynReply", "SynStream", "WindowUpdate", "decode_header_block", "encode_header_block"]

VERSION = 3
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02   # SYN_STREAM only
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
# RST_STREAM status codes (section 2.6.3)
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, UNSUPPORTED_VERSION, CANCEL, INTERNAL_ERROR = 1, 2, 3, 4, 5, 6
MAX_LENGTH = (1 << 24) - 1
_MAX_BLOCK = 1 << 20   # a decompressed header block larger than this is refused

# The header compression dictionary of draft-mbelshe-httpbis-spdy-00 section 2.6.10.1 (the SPDY/3 draft's
# "Compression"), byte for byte as moby/spdystream's spdy/dictionary.go (``headerDictionary``) carries it:
# 1423 bytes, adler32 0xe3c6a7c2 (the DICTID a zlib stream preset with it names), no trailing NUL -- the
# words each after their 32-bit length, then a run of plain text.
_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges age "
    "allow authorization cache-control connection content-base content-encoding content-language content-length "
    "content-location content-md5 content-range content-type date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
    "user-agent vary via warning www-authenticate method get status"
).split() + ["200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
_TEXT = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(len(w).to_bytes(4, "big") + w.encode() for w in _WORDS) + _TEXT.encode()

HeaderBlock = dict[str, list[str]]


@dataclass(frozen=True)
class SynStream:
    stream_id: int
    headers: HeaderBlock
    flags: int = 0
    associated_id: int = 0
    priority: int = 0
    slot: int = 0


@dataclass(frozen=True)
class SynReply:
    stream_id: int
    headers: HeaderBlock = field(default_factory=dict)
    flags: int = 0


@dataclass(frozen=True)
class RstStream:
    stream_id: int
    status: int


@dataclass(frozen=True)
class Settings:
    entries: tuple[tuple[int, int, int], ...] = ()   # (flags, id, value)
    flags: int = 0


@dataclass(frozen=True)
class Ping:
    ping_id: int


@dataclass(frozen=True)
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass(frozen=True)
class Headers:
    stream_id: int
    headers: HeaderBlock
    flags: int = 0


@dataclass(frozen=True)
class WindowUpdate:
    stream_id: int
    delta: int


@dataclass(frozen=True)
class Data:
    stream_id: int
    data: bytes
    flags: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


Frame = SynStream | SynReply | RstStream | Settings | Ping | GoAway | Headers | WindowUpdate | Data


def encode_header_block(headers: Mapping[str, str | Sequence[str]]) -> bytes:
    """The uncompressed name/value block (section 2.6.10): names lowercased, values joined by NUL."""
    out = [len(headers).to_bytes(4, "big")]
    for name, value in headers.items():
        raw_name = name.lower().encode()
        raw_value = (value if isinstance(value, str) else "\0".join(value)).encode()
        out += [len(raw_name).to_bytes(4, "big"), raw_name, len(raw_value).to_bytes(4, "big"), raw_value]
    return b"".join(out)


def decode_header_block(raw: bytes) -> HeaderBlock:
    """The name/value block back into ``{name: [values]}``; ValueError when it is malformed."""
    if len(raw) < 4:
        raise ValueError("header block shorter than its count")
    count, pos = int.from_bytes(raw[:4], "big"), 4
    out: HeaderBlock = {}
    for _ in range(count):
        parts = []
        for _what in ("name", "value"):
            if pos + 4 > len(raw):
                raise ValueError("header block ends inside a length")
            n = int.from_bytes(raw[pos:pos + 4], "big")
            if pos + 4 + n > len(raw):
                raise ValueError("header block ends inside a name or value")
            parts.append(raw[pos + 4:pos + 4 + n].decode("utf-8", "replace"))
            pos += 4 + n
        name, value = parts[0].lower(), parts[1]
        if not name or name in out:
            raise ValueError(f"empty or duplicate header name {name!r}")
        out[name] = value.split("\0")
    if pos != len(raw):
        raise ValueError("bytes after the header block")
    return out


def _control(kind: int, flags: int, data: bytes) -> bytes:
    if len(data) > MAX_LENGTH:
        raise ValueError("control frame too long")
    return ((0x8000 | VERSION) << 16 | kind).to_bytes(4, "big") + (flags << 24 | len(data)).to_bytes(4, "big") + data


def _id(value: int) -> bytes:
    return (value & 0x7FFFFFFF).to_bytes(4, "big")


class FrameWriter:
    """Frames to bytes; one compression context for the header blocks this side sends."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, DICTIONARY)

    def _block(self, headers: Mapping[str, str | Sequence[str]]) -> bytes:
        return self._deflate.compress(encode_header_block(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def encode(self, frame: Frame) -> bytes:
        """The frame's bytes.  Frames with header blocks must go out in the order they are encoded."""
        if isinstance(frame, Data):
            if len(frame.data) > MAX_LENGTH:
                raise ValueError("data frame too long")
            return _id(frame.stream_id) + (frame.flags << 24 | len(frame.data)).to_bytes(4, "big") + frame.data
        if isinstance(frame, SynStream):
            head = _id(frame.stream_id) + _id(frame.associated_id) + bytes([(frame.priority & 7) << 5, frame.slot])
            return _control(SYN_STREAM, frame.flags, head + self._block(frame.headers))
        if isinstance(frame, SynReply):
            return _control(SYN_REPLY, frame.flags, _id(frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, Headers):
            return _control(HEADERS, frame.flags, _id(frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, RstStream):
            return _control(RST_STREAM, 0, _id(frame.stream_id) + frame.status.to_bytes(4, "big"))
        if isinstance(frame, Settings):
            body = len(frame.entries).to_bytes(4, "big") + b"".join(
                (f << 24 | i).to_bytes(4, "big") + v.to_bytes(4, "big") for f, i, v in frame.entries)
            return _control(SETTINGS, frame.flags, body)
        if isinstance(frame, Ping):
            return _control(PING, 0, frame.ping_id.to_bytes(4, "big"))
        if isinstance(frame, GoAway):
            return _control(GOAWAY, 0, _id(frame.last_good_stream_id) + frame.status.to_bytes(4, "big"))
        return _control(WINDOW_UPDATE, 0, _id(frame.stream_id) + _id(frame.delta))


class FrameReader:
    """Bytes to frames, fed as they arrive (a frame may span several feeds, a feed hold several frames);
    one decompression context for the header blocks the peer sends.  ValueError on a malformed frame."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._inflate = zlib.decompressobj(zlib.MAX_WBITS, DICTIONARY)

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= 8:
            length = int.from_bytes(self._buf[5:8], "big")
            if len(self._buf) < 8 + length:
                break
            head, body = bytes(self._buf[:8]), bytes(self._buf[8:8 + length])
            del self._buf[:8 + length]
            frames.append(self._frame(head, body))
        return frames

    def _block(self, raw: bytes) -> HeaderBlock:
        try:
            plain = self._inflate.decompress(raw, _MAX_BLOCK)
        except zlib.error as exc:
            raise ValueError(f"header block does not inflate: {exc}") from None
        if self._inflate.unconsumed_tail:
            raise ValueError("header block too large")
        return decode_header_block(plain)

    def _frame(self, head: bytes, body: bytes) -> Frame:
        word, flags = int.from_bytes(head[:4], "big"), head[4]
        if not word & 0x80000000:
            return Data(word & 0x7FFFFFFF, body, flags)
        version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
        if version != VERSION:
            raise ValueError(f"unsupported SPDY version {version}")
        need = {SYN_STREAM: 10, SYN_REPLY: 4, RST_STREAM: 8, SETTINGS: 4, PING: 4, GOAWAY: 8, HEADERS: 4,
                WINDOW_UPDATE: 8}
        if kind not in need:
            raise ValueError(f"unknown control frame type {kind}")
        if len(body) < need[kind]:
            raise ValueError(f"control frame type {kind} too short")
        first = int.from_bytes(body[:4], "big") & 0x7FFFFFFF
        second = int.from_bytes(body[4:8], "big") if len(body) >= 8 else 0
        if kind == SYN_STREAM:
            return SynStream(first, self._block(body[10:]), flags, second & 0x7FFFFFFF, body[8] >> 5, body[9])
        if kind in (SYN_REPLY, HEADERS):
            cls = SynReply if kind == SYN_REPLY else Headers
            return cls(first, self._block(body[4:]), flags)
        if kind == RST_STREAM:
            return RstStream(first, second)
        if kind == SETTINGS:
            count = int.from_bytes(body[:4], "big")
            if len(body) != 4 + 8 * count:
                raise ValueError("SETTINGS length does not match its count")
            entries = _settings(body[4 + 8 * i:12 + 8 * i] for i in range(count))
            return Settings(tuple(entries), flags)
        if kind == PING:
            return Ping(int.from_bytes(body[:4], "big"))
        if kind == GOAWAY:
            return GoAway(first, second)
        return WindowUpdate(first, second & 0x7FFFFFFF)


def _settings(chunks: Iterable[bytes]) -> list[tuple[int, int, int]]:
    out = []
    for chunk in chunks:
        word = int.from_bytes(chunk[:4], "big")
        out.append((word >> 24, word & 0xFFFFFF, int.from_bytes(chunk[4:], "big")))
    return out
