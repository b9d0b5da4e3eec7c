"""Operator identity: a canonical encoding of parameters, and the two hashes built on it.

FlowMesh gives every operator two identities (FlowMesh paper, "Cross-DAG consolidation";
summarised in ``shared/seeds/001_*.txt``):

* ``H_task`` -- *exact match*.  Image (or model) digest, the canonical parameters and the
  hash of every input.  Two requests with the same ``H_task`` ask for the same result, so
  it is computed at most once and reused (:mod:`flowmesh_sdk.reuse`).
* ``H_exec`` -- *compatible match*.  Image (or model) digest, the parameters *minus* the
  per-item inputs, and the resource class.  Two requests with the same ``H_exec`` can be
  served by the same executor (one warm container shape, one micro-batch of an inference
  engine), each keeping its own answer.

Both are ``"sha256:" + 64 hex digits`` of a domain tag followed by the canonical encoding
of a list.  The encoding (version 2, below) is the contract: it is stable across
processes, machines and Python versions, and ``tests/test_identity.py`` pins golden
vectors of it.  ``docs/identity.md`` explains every field that goes into each hash.

Canonical encoding, version 2 (every length and count is an unsigned 64-bit big-endian
integer, written ``u64``)::

    None          b"N"
    False / True  b"F" / b"T"
    int           b"i" u64(len) ASCII decimal (optional "-", no leading zeros)
    float         b"f" 8 bytes IEEE-754 binary64, big-endian; -0.0 is written as 0.0;
                  NaN and +-inf are refused
    str           b"s" u64(len) UTF-8 of the string exactly as given (no Unicode
                  normalisation: "\u00e9" and "e\u0301" are different commands, so they
                  are different values); lone surrogates are refused
    bytes         b"b" u64(len) the raw bytes (bytes never equal a str)
    list / tuple  b"l" u64(count) each item
    dict          b"d" u64(count) then key, value for each entry, ordered by the encoded
                  key bytes; keys must be str

Version 1 NFC-normalised every string, so two spellings of one text that a shell runs as
different bytes shared an ``H_task`` (a wrong result could be reused).  Version 2 hashes
the exact bytes and uses new domain tags (``/v2``), so no v2 identity equals a v1 one; v1
identities are not computed any more, and results stored under them are simply never
found (they are recomputed once under their v2 identity).

Anything else (sets, objects, bool-like numbers of other types) raises
:class:`~flowmesh_sdk.errors.SpecError` naming where in the value it sits: a set has no
order, an object has no canonical form.  Sort a set into a list yourself.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from .errors import SpecError
from .specs import SandboxSpec, Task

__all__ = [
    "ENCODING_VERSION", "TaskIdentity", "call_identity", "canonical", "check_digest", "decode",
    "digest_bytes",
    "h_exec", "h_task", "is_digest", "label_digest", "sandbox_h_exec", "task_identity",
]

ENCODING_VERSION = 2
_DOMAIN_TASK = b"flowmesh/h_task/v2\x00"
_DOMAIN_EXEC = b"flowmesh/h_exec/v2\x00"
_DOMAIN_LABEL = b"flowmesh/label/v2\x00"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
_U64 = struct.Struct(">Q")
_F64 = struct.Struct(">d")


# ---- canonical encoding -------------------------------------------------------------------

def canonical(value: object, *, where: str = "value") -> bytes:
    """The canonical bytes of ``value`` (see the module docstring for the format)."""
    out = bytearray()
    _encode(value, out, where)
    return bytes(out)


def _len(n: int) -> bytes:
    return _U64.pack(n)


def _text(s: str, where: str) -> bytes:
    try:
        return s.encode("utf-8")   # the exact bytes: no normalisation (encoding v2)
    except UnicodeEncodeError as exc:  # lone surrogates have no UTF-8 form
        raise SpecError(where, f"strings must be valid Unicode (no lone surrogates): {exc}") from exc


def _encode(v: object, out: bytearray, where: str) -> None:
    if v is None:
        out += b"N"
    elif v is True:
        out += b"T"
    elif v is False:
        out += b"F"
    elif type(v) is int:
        text = str(v).encode("ascii")
        out += b"i" + _len(len(text)) + text
    elif type(v) is float:
        if not math.isfinite(v):
            raise SpecError(where, f"floats must be finite (NaN and infinities have no canonical "
                                   f"form), got {v!r}")
        out += b"f" + _F64.pack(v + 0.0)  # -0.0 + 0.0 == 0.0: one zero
    elif isinstance(v, str):
        data = _text(v, where)
        out += b"s" + _len(len(data)) + data
    elif isinstance(v, (bytes, bytearray, memoryview)):
        data = bytes(v)
        out += b"b" + _len(len(data)) + data
    elif isinstance(v, Mapping):
        entries: list[tuple[bytes, object, str]] = []
        for key, item in v.items():
            if not isinstance(key, str):
                raise SpecError(f"{where}[{key!r}]", f"dict keys must be strings, got {type(key).__name__}")
            entries.append((_text(key, f"{where}[{key!r}]"), item, key))
        entries.sort(key=lambda e: e[0])   # distinct str keys have distinct UTF-8 bytes
        out += b"d" + _len(len(entries))
        for kbytes, item, key in entries:
            out += b"s" + _len(len(kbytes)) + kbytes
            _encode(item, out, f"{where}[{key!r}]")
    elif isinstance(v, (list, tuple)):
        out += b"l" + _len(len(v))
        for i, item in enumerate(v):
            _encode(item, out, f"{where}[{i}]")
    elif isinstance(v, (set, frozenset)):
        raise SpecError(where, "sets have no canonical order: sort them into a list")
    else:
        raise SpecError(where, f"{type(v).__name__} has no canonical encoding; use None, bool, int, "
                               "float, str, bytes, list/tuple or a dict with str keys")


def decode(data: bytes) -> object:
    """The value that :func:`canonical` encoded (lists for lists and tuples, dicts for dicts).

    Raises :class:`~flowmesh_sdk.errors.SpecError` (field ``canonical``; a ValueError too)
    on anything that is not exactly one canonical value.  Encodings v1 and v2 share one
    byte format (they differ only in what a string is normalised to before it is written),
    so this reads both."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SpecError("canonical", f"must be bytes, got {type(data).__name__}")
    try:
        value, end = _decode(memoryview(bytes(data)), 0)
        if end != len(data):
            raise ValueError(f"trailing bytes after the canonical value at offset {end}")
    except SpecError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SpecError("canonical", f"not a canonical encoding: {exc}") from exc
    return value


def _read_len(buf: memoryview, pos: int) -> tuple[int, int]:
    if pos + 8 > len(buf):
        raise ValueError(f"truncated length at offset {pos}")
    return _U64.unpack_from(buf, pos)[0], pos + 8


def _read(buf: memoryview, pos: int, n: int) -> tuple[bytes, int]:
    if pos + n > len(buf):
        raise ValueError(f"truncated value at offset {pos}")
    return bytes(buf[pos:pos + n]), pos + n


def _decode(buf: memoryview, pos: int) -> tuple[object, int]:
    if pos >= len(buf):
        raise ValueError(f"truncated input at offset {pos}")
    tag = bytes(buf[pos:pos + 1])
    pos += 1
    if tag == b"N":
        return None, pos
    if tag == b"T":
        return True, pos
    if tag == b"F":
        return False, pos
    if tag == b"i":
        n, pos = _read_len(buf, pos)
        raw, pos = _read(buf, pos, n)
        return int(raw.decode("ascii")), pos
    if tag == b"f":
        raw, pos = _read(buf, pos, 8)
        return _F64.unpack(raw)[0], pos
    if tag in (b"s", b"b"):
        n, pos = _read_len(buf, pos)
        raw, pos = _read(buf, pos, n)
        return (raw.decode("utf-8") if tag == b"s" else raw), pos
    if tag == b"l":
        n, pos = _read_len(buf, pos)
        items = []
        for _ in range(n):
            item, pos = _decode(buf, pos)
            items.append(item)
        return items, pos
    if tag == b"d":
        n, pos = _read_len(buf, pos)
        out: dict[str, object] = {}
        for _ in range(n):
            key, pos = _decode(buf, pos)
            if not isinstance(key, str):
                raise ValueError(f"dict key is not a string at offset {pos}")
            out[key], pos = _decode(buf, pos)
        return out, pos
    raise ValueError(f"unknown tag {tag!r} at offset {pos - 1}")


# ---- digests --------------------------------------------------------------------------

def digest_bytes(data: bytes) -> str:
    """``"sha256:<hex>"`` of ``data``: the content address of a CAS object or an input."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(_DIGEST.fullmatch(value))


def check_digest(field: str, value: object) -> str:
    """``value`` if it is a content digest (``sha256:`` + 64 hex, or ``sha512:`` + 128 hex);
    SpecError otherwise -- in particular for an image tag, which can move."""
    if not is_digest(value):
        hint = (" (an image tag can move; resolve it to its digest first, e.g. with "
                "fleet.images.resolve)") if isinstance(value, str) and ":" in value and "/" in value else ""
        raise SpecError(field, f"must be a content digest 'sha256:<64 lowercase hex>', got {value!r}{hint}")
    return value


def label_digest(label: str) -> str:
    """A digest standing for the code of an operator that has no image or model, from a
    version label you bump when the code changes (e.g. ``"reward-fn@3"``)."""
    if not isinstance(label, str) or not label:
        raise SpecError("label", f"must be a non-empty string, got {label!r}")
    return "sha256:" + hashlib.sha256(_DOMAIN_LABEL + canonical(label)).hexdigest()


def _inputs(inputs: Mapping[str, str] | Sequence[str]) -> dict[str, str] | list[str]:
    if isinstance(inputs, Mapping):
        return {str(k): check_digest(f"inputs[{k!r}]", v) for k, v in inputs.items()}
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
        raise SpecError("inputs", f"must be a list of digests or a {{name: digest}} mapping, "
                                  f"got {type(inputs).__name__}")
    return [check_digest(f"inputs[{i}]", v) for i, v in enumerate(inputs)]


def h_task(image_or_model: str, params: Mapping[str, object],
           inputs: Mapping[str, str] | Sequence[str] = ()) -> str:
    """``H_task = sha256(b"flowmesh/h_task/v2\\0" + canonical([digest, params, inputs]))``.

    ``image_or_model`` is a content digest (never a tag); ``params`` everything that changes
    the result; ``inputs`` the digests of the inputs, as an ordered list or a name -> digest
    mapping (a mapping is ordered by name)."""
    check_digest("image_or_model", image_or_model)
    if not isinstance(params, Mapping):
        raise SpecError("params", f"must be a mapping, got {type(params).__name__}")
    body = canonical([image_or_model, dict(params), _inputs(inputs)], where="h_task")
    return "sha256:" + hashlib.sha256(_DOMAIN_TASK + body).hexdigest()


def h_exec(image_or_model: str, params: Mapping[str, object], resource_class: object) -> str:
    """``H_exec = sha256(b"flowmesh/h_exec/v2\\0" + canonical([digest, params, resource_class]))``.

    ``params`` must already exclude the per-item inputs (a prompt, a patch, a command):
    what remains is what an executor is configured with (sampling parameters, container
    shape).  ``resource_class`` is a string or a mapping (e.g. ``{"gpu": "H100", "gpus": 1}``).
    A GPU inference endpoint groups requests into one micro-batch by this value."""
    check_digest("image_or_model", image_or_model)
    if not isinstance(params, Mapping):
        raise SpecError("params", f"must be a mapping, got {type(params).__name__}")
    body = canonical([image_or_model, dict(params), resource_class], where="h_exec")
    return "sha256:" + hashlib.sha256(_DOMAIN_EXEC + body).hexdigest()


# ---- sandbox tasks ------------------------------------------------------------------------

def _container_params(spec: SandboxSpec) -> dict[str, object]:
    """What a container fixes when it is created (besides its image and limits)."""
    # none/all stay the booleans they always were (same digests); an allow-list is its
    # sorted entries, so the same policy is the same warm slot
    network = spec.network if isinstance(spec.network, bool) else tuple(spec.network)
    params: dict[str, object] = {"op": "sandbox", "network": network, "workdir": spec.workdir}
    if spec.kernel != "host":   # named only when not the default: the runc digests stay as they were
        params["kernel"] = spec.kernel
    return params


def _resource_class(spec: SandboxSpec) -> dict[str, object]:
    # float() so that cpus=1 and cpus=1.0, which make the same container, hash the same
    return {"cpus": float(spec.cpus), "memory_gb": float(spec.memory_gb), "pids": int(spec.pids)}


def sandbox_h_exec(spec: SandboxSpec, image_digest: str) -> str:
    """The execution signature of a sandbox container: same image digest, same limits,
    same network and workdir -> same warm slot.  Env, command and files are per task.
    (Memoised: pools ask for it on every placement.)"""
    return _sandbox_h_exec(image_digest, tuple(sorted(_container_params(spec).items())),
                           tuple(sorted(_resource_class(spec).items())))


@functools.lru_cache(maxsize=65536)
def _sandbox_h_exec(image_digest: str, params: tuple[tuple[str, object], ...],
                    resource_class: tuple[tuple[str, object], ...]) -> str:
    return h_exec(image_digest, {k: list(v) if isinstance(v, tuple) else v for k, v in params},
                  dict(resource_class))


@dataclass(frozen=True, slots=True)
class TaskIdentity:
    """The two identities of one operator: a :class:`~flowmesh_sdk.specs.Task` on one image
    digest, or an in-process call on one image/model digest (``image_digest``), and the
    input digests that went into ``h_task`` (``inputs``: path or input name -> digest)."""

    h_task: str
    h_exec: str
    image_digest: str
    inputs: Mapping[str, str]


def task_params(task: Task) -> dict[str, object]:
    """The parameters of a task that change its result.  Not in it: ``name`` (a label)
    and ``tenant`` (who asks must not change what the answer is)."""
    spec = task.sandbox
    timeout = task.timeout_s if task.timeout_s is not None else spec.timeout_s
    return {**_container_params(spec), **_resource_class(spec),
            "command": task.command, "env": dict(spec.env), "timeout_s": float(timeout),
            "seed": task.seed}


def task_identity(task: Task, image_digest: str) -> TaskIdentity:
    """``H_task`` and ``H_exec`` of ``task`` run on the image ``image_digest`` (resolved from
    ``task.sandbox.image`` by the caller: a tag is refused here)."""
    if not isinstance(task, Task):
        raise SpecError("task", f"must be a Task, got {type(task).__name__}")
    check_digest("image_digest", image_digest)
    inputs = {path: digest_bytes(bytes(data)) for path, data in task.files.items()}
    return TaskIdentity(h_task=h_task(image_digest, task_params(task), inputs),
                        h_exec=sandbox_h_exec(task.sandbox, image_digest),
                        image_digest=image_digest, inputs=inputs)


# ---- in-process operators (inference calls, training steps, functions) -----------------------

def call_identity(kind: str, image_or_model: str, params: Mapping[str, object],
                  inputs: Mapping[str, bytes], resource_class: object = "cpu",
                  seed: int | None = None) -> TaskIdentity:
    """The identities of an in-process operator (what :meth:`ResultReuse.call` uses)::

        H_task = h_task(image_or_model, {"op": kind, "params": params, "seed": seed},
                        {input name: sha256(bytes)})
        H_exec = h_exec(image_or_model, {"op": kind, "params": params}, resource_class)

    For an inference request ``kind`` is ``"inference"``, ``image_or_model`` the model's
    digest, ``params`` the sampling parameters and the prompt an input: requests with the
    same ``h_exec`` can share one micro-batch, each answer going back to its requester."""
    if not isinstance(kind, str) or not kind:
        raise SpecError("kind", f"must be a non-empty string, got {kind!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise SpecError("seed", f"must be a non-negative integer, got {seed!r}")
    if not isinstance(params, Mapping):
        raise SpecError("params", f"must be a mapping, got {type(params).__name__}")
    if not isinstance(inputs, Mapping):
        raise SpecError("inputs", f"must be a {{name: bytes}} mapping, got {type(inputs).__name__}")
    digests: dict[str, str] = {}
    for k, v in inputs.items():
        if not isinstance(k, str):
            raise SpecError(f"inputs[{k!r}]", f"names must be strings, got {type(k).__name__}")
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise SpecError(f"inputs[{k!r}]", f"must be bytes, got {type(v).__name__}")
        digests[k] = digest_bytes(bytes(v))
    return TaskIdentity(h_task=h_task(image_or_model, {"op": kind, "params": dict(params), "seed": seed},
                                      digests),
                        h_exec=h_exec(image_or_model, {"op": kind, "params": dict(params)}, resource_class),
                        image_digest=check_digest("image_or_model", image_or_model), inputs=digests)
