"""Canonical encoding and the two operator identities (H_task, H_exec).

The golden vectors below were computed once with flowmesh_sdk.identity (encoding v2: strings
as their exact UTF-8 bytes, domain tags ``/v2``) and pinned; the first h_task was also
recomputed by hand from the byte layout (test_h_task_by_hand).  A change to any of them
changes every stored identity, and must come with a new encoding version (docs/identity.md).
Version 1 (NFC-normalised strings) is retired, not readable as an identity, so its vectors
are gone.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from flowmesh_sdk import SandboxSpec, SpecError, Task
from flowmesh_sdk.identity import (call_identity, canonical, check_digest, decode, digest_bytes, h_exec,
                                   h_task, label_digest, sandbox_h_exec, task_identity)

ROOT = Path(__file__).resolve().parents[1]
D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64

# value -> canonical bytes (hex), pinned
ENCODING_VECTORS = [
    (None, "4e"),
    (True, "54"),
    (False, "46"),
    (0, "69000000000000000130"),
    (-1, "6900000000000000022d31"),
    (2 ** 70, "69000000000000001631313830353931363230373137343131333033343234"),
    (1.5, "663ff8000000000000"),
    (-0.0, "660000000000000000"),
    ("\u00e9", "730000000000000002c3a9"),
    ("e\u0301", "73000000000000000365cc81"),     # NFD: its own bytes, not the NFC form
    (b"\x00\xff", "62000000000000000200ff"),
    ([1, "a"], "6c00000000000000026900000000000000013173000000000000000161"),
    ({"b": 1, "a": [None]},
     "640000000000000002730000000000000001616c00000000000000014e7300000000000000016269000000000000000131"),
]

GOLDEN_H_TASK = "sha256:f8de87d6cb17728c511d0c588e4aac6531034fefe0e4c3b14c2b4a835b201e1d"
GOLDEN_H_EXEC = "sha256:f9630c5eaed943071aca3b8f6a88538f35d8ec371714e9d82d48a47ed25c3893"
GOLDEN_LABEL = "sha256:ff500250b920c59259b72ca22220afd7df4c502482ebe73ad45e0e19c388845b"
GOLDEN_TASK_H_TASK = "sha256:2aed69f08d0ace9fe149dc2817948102d36710d1474e3a9f183314c9db703ab9"
GOLDEN_TASK_H_EXEC = "sha256:83cdb15c6ee8274808cf0f0f89800e3261964b106358bee907b5b2ea2dd99f0f"
GOLDEN_CALL_H_TASK = "sha256:9470080c547657756e61db2ed4dfd2bad9bef88bbb35647df0568140d17c935d"
GOLDEN_CALL_H_EXEC = "sha256:f854fa48073d6616e854bcb7dc48af4c6960f0397ea41fc336d66a7094499f85"
SAMPLING = {"temperature": 1.0, "max_tokens": 4096}
GPU = {"gpu": "H100", "gpus": 1}


def _golden_task(**kw) -> Task:
    fields = dict(name="t", sandbox=SandboxSpec(image="localhost/flowmesh/busybox:1", cpus=1, memory_gb=0.5),
                  command="sh /work/check.sh", files={"/work/patch.diff": b"--- a\n+++ b\n"},
                  deterministic=True)
    fields.update(kw)
    return Task(**fields)


@pytest.mark.parametrize("value,hexbytes", ENCODING_VECTORS, ids=lambda v: repr(v)[:20])
def test_canonical_bytes_are_pinned(value, hexbytes):
    assert canonical(value).hex() == hexbytes


def test_golden_hashes():
    assert h_task(D1, {"command": "pytest -q", "timeout_s": 60.0},
                  {"/work/patch.diff": digest_bytes(b"patch")}) == GOLDEN_H_TASK
    assert h_exec(D1, {"temperature": 1.0, "max_tokens": 4096}, {"gpu": "H100", "gpus": 1}) == GOLDEN_H_EXEC
    assert label_digest("reward@1") == GOLDEN_LABEL
    ident = task_identity(_golden_task(), D1)
    assert ident.h_task == GOLDEN_TASK_H_TASK
    assert ident.h_exec == GOLDEN_TASK_H_EXEC
    assert ident.inputs == {"/work/patch.diff": digest_bytes(b"--- a\n+++ b\n")}


def test_stable_across_processes_and_hash_seeds():
    """A fresh interpreter with another PYTHONHASHSEED (dict/set order, str hashes) and the
    dict built in the opposite order computes the same identities."""
    code = (
        "import json\n"
        "from flowmesh_sdk.identity import h_task, h_exec, digest_bytes\n"
        f"D1 = {D1!r}\n"
        "print(json.dumps([h_task(D1, {'timeout_s': 60.0, 'command': 'pytest -q'},\n"
        "                         {'/work/patch.diff': digest_bytes(b'patch')}),\n"
        "                  h_exec(D1, {'max_tokens': 4096, 'temperature': 1.0}, {'gpus': 1, 'gpu': 'H100'})]))\n")
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        assert json.loads(out) == [GOLDEN_H_TASK, GOLDEN_H_EXEC]


def test_types_are_never_confused():
    assert canonical(1) != canonical(1.0)
    assert canonical(1) != canonical(True)
    assert canonical("a") != canonical(b"a")
    assert canonical([]) != canonical({})
    assert canonical(None) != canonical("")
    assert canonical((1, 2)) == canonical([1, 2])     # both are sequences
    assert canonical(0.0) == canonical(-0.0)          # one zero
    # float exactness: neighbouring doubles differ
    assert canonical(0.1) != canonical(0.1 + 2 ** -56)
    # length prefixes: no concatenation ambiguity
    assert canonical(["ab", "c"]) != canonical(["a", "bc"])


def test_dict_order_does_not_matter():
    assert canonical({"x": 1, "y": 2}) == canonical({"y": 2, "x": 1})
    assert h_task(D1, {"a": 1, "b": 2}) == h_task(D1, {"b": 2, "a": 1})


@pytest.mark.parametrize("bad,where", [
    (float("nan"), "value"), (float("inf"), "value"), ({1, 2}, "value"), ({1: "x"}, "value[1]"),
    (object(), "value"), ({"k": [1, {"z": float("-inf")}]}, "value['k'][1]['z']"),
    ("\ud800", "value"), ({"k": "\udfff"}, "value['k']"),
])
def test_values_without_a_canonical_form_are_refused(bad, where):
    with pytest.raises(SpecError) as ei:
        canonical(bad)
    assert ei.value.field.startswith(where)


def test_decode_round_trips_and_refuses_garbage():
    value = {"s": "x\u00e9", "b": b"\x00", "i": -(2 ** 65), "f": 0.25, "l": [None, True, False],
             "d": {"k": []}}
    assert decode(canonical(value)) == value
    for garbage in (b"", b"x", b"s\x00\x00\x00\x00\x00\x00\x00\x05ab", canonical(1) + b"N"):
        with pytest.raises(ValueError):
            decode(garbage)


def test_tags_are_refused_where_a_digest_is_needed():
    for bad in ("localhost/flowmesh/busybox:1", "busybox:latest", "sha256:" + "A" * 64, "sha256:abc", ""):
        with pytest.raises(SpecError) as ei:
            h_task(bad, {})
        assert ei.value.field == "image_or_model"
        with pytest.raises(SpecError):
            h_exec(bad, {}, "cpu")
    with pytest.raises(SpecError, match="resolve it to its digest"):
        check_digest("image", "localhost/flowmesh/busybox:1")
    with pytest.raises(SpecError) as ei:
        h_task(D1, {}, ["not-a-digest"])
    assert ei.value.field == "inputs[0]"
    with pytest.raises(SpecError):
        task_identity(_golden_task(), "localhost/flowmesh/busybox:1")


def test_one_byte_of_input_changes_h_task_but_not_h_exec():
    a = task_identity(_golden_task(files={"/work/patch.diff": b"fix = 1\n"}), D1)
    b = task_identity(_golden_task(files={"/work/patch.diff": b"fix = 2\n"}), D1)
    assert a.h_task != b.h_task
    assert a.h_exec == b.h_exec          # same container shape: same warm slot
    # the same bytes at another path are another input
    c = task_identity(_golden_task(files={"/work/other.diff": b"fix = 1\n"}), D1)
    assert c.h_task != a.h_task


def test_same_patch_on_two_image_digests_never_shares():
    a = task_identity(_golden_task(), D1)
    b = task_identity(_golden_task(), D2)
    assert a.h_task != b.h_task and a.h_exec != b.h_exec


def test_what_is_and_is_not_in_h_task():
    base = task_identity(_golden_task(), D1).h_task
    # labels and who asks are not part of the work
    assert task_identity(_golden_task(name="other-name"), D1).h_task == base
    assert task_identity(_golden_task(tenant="bob"), D1).h_task == base
    # everything that can change the result is
    spec = _golden_task().sandbox
    changed = [
        _golden_task(command="sh /work/check.sh -v"),
        _golden_task(timeout_s=5),
        _golden_task(seed=1),
        _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.25)),
        _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, env={"K": "v"})),
        _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, network=True)),
        _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, pids=64)),
        _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, workdir="/tmp")),
    ]
    hashes = {task_identity(t, D1).h_task for t in changed}
    assert base not in hashes and len(hashes) == len(changed)
    # the seed and env are per task: H_exec (the container shape) ignores them
    assert task_identity(_golden_task(seed=1), D1).h_exec == task_identity(_golden_task(), D1).h_exec
    # cpus=1 and cpus=1.0 make the same container
    s1 = SandboxSpec(image=spec.image, cpus=1, memory_gb=1)
    s2 = SandboxSpec(image=spec.image, cpus=1.0, memory_gb=1.0)
    assert sandbox_h_exec(s1, D1) == sandbox_h_exec(s2, D1)
    assert sandbox_h_exec(s1, D1) != sandbox_h_exec(SandboxSpec(image=spec.image, cpus=2, memory_gb=1), D1)


def test_task_seed_and_deterministic_are_validated():
    with pytest.raises(SpecError) as ei:
        _golden_task(seed=-1)
    assert ei.value.field == "task.seed"
    with pytest.raises(SpecError):
        _golden_task(seed=True)
    with pytest.raises(SpecError) as ei:
        _golden_task(deterministic="yes")
    assert ei.value.field == "task.deterministic"


def test_inputs_as_list_keep_their_order_and_differ_from_a_mapping():
    i1, i2 = digest_bytes(b"1"), digest_bytes(b"2")
    assert h_task(D1, {}, [i1, i2]) != h_task(D1, {}, [i2, i1])
    assert h_task(D1, {}, {"a": i1, "b": i2}) == h_task(D1, {}, {"b": i2, "a": i1})
    assert h_task(D1, {}, [i1]) != h_task(D1, {}, {"0": i1})


def test_call_identity_golden_and_what_h_exec_groups():
    ident = call_identity("inference", D1, SAMPLING, {"prompt": b"fix the bug"}, GPU, seed=7)
    assert (ident.h_task, ident.h_exec) == (GOLDEN_CALL_H_TASK, GOLDEN_CALL_H_EXEC)
    # another prompt or seed: other work, same micro-batch
    other = call_identity("inference", D1, SAMPLING, {"prompt": b"fix the test"}, GPU, seed=8)
    assert other.h_task != ident.h_task and other.h_exec == ident.h_exec
    # other sampling parameters, model, resource class or kind: another batch
    for changed in (call_identity("inference", D1, {**SAMPLING, "temperature": 0.0}, {}, GPU),
                    call_identity("inference", D2, SAMPLING, {}, GPU),
                    call_identity("inference", D1, SAMPLING, {}, {"gpu": "RTX 4090", "gpus": 1}),
                    call_identity("train", D1, SAMPLING, {}, GPU)):
        assert changed.h_exec != ident.h_exec
    # a parameter named like the seed or kind does not collide with them
    a = call_identity("inference", D1, {"seed": 1}, {}, GPU, seed=None)
    b = call_identity("inference", D1, {}, {}, GPU, seed=1)
    assert a.h_task != b.h_task
    with pytest.raises(SpecError):
        call_identity("inference", "meta-llama/Llama-3.1-8B", SAMPLING, {}, GPU)
    with pytest.raises(SpecError):
        call_identity("", D1, SAMPLING, {}, GPU)


def test_h_task_by_hand():
    """GOLDEN_H_TASK rebuilt from the documented byte layout, without canonical()."""
    def u64(n):
        return struct.pack(">Q", n)

    def s(text):
        return b"s" + u64(len(text.encode())) + text.encode()
    body = (b"l" + u64(3) + s(D1)
            + b"d" + u64(2) + s("command") + s("pytest -q") + s("timeout_s") + b"f" + struct.pack(">d", 60.0)
            + b"d" + u64(1) + s("/work/patch.diff") + s("sha256:" + hashlib.sha256(b"patch").hexdigest()))
    assert "sha256:" + hashlib.sha256(b"flowmesh/h_task/v2\x00" + body).hexdigest() == GOLDEN_H_TASK


def test_nfc_and_nfd_spellings_are_different_work():
    """Defect 5 (issue 12): a command, an env value or a file path spelled in NFD is other
    bytes than its NFC spelling -- it runs differently -- so it is another H_task."""
    nfc, nfd = "\u00e9", "e\u0301"
    spec = SandboxSpec(image="localhost/flowmesh/busybox:1", cpus=1, memory_gb=0.5)
    pairs = [
        (_golden_task(command=f"printf {nfc}"), _golden_task(command=f"printf {nfd}")),
        (_golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, env={"K": nfc})),
         _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, env={"K": nfd}))),
        (_golden_task(files={f"/work/{nfc}": b"x"}), _golden_task(files={f"/work/{nfd}": b"x"})),
        (_golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, workdir=f"/{nfc}")),
         _golden_task(sandbox=SandboxSpec(image=spec.image, cpus=1, memory_gb=0.5, workdir=f"/{nfd}"))),
    ]
    for a, b in pairs:
        assert task_identity(a, D1).h_task != task_identity(b, D1).h_task
    # two dict keys that are equal only after NFC are two keys now, not an error
    assert decode(canonical({nfc: 1, nfd: 2})) == {nfc: 1, nfd: 2}
    assert h_task(D1, {"command": nfc}) != h_task(D1, {"command": nfd})


def test_a_digest_with_a_trailing_newline_is_refused():
    with pytest.raises(SpecError):
        check_digest("image", D1 + "\n")


def test_bad_input_to_identity_is_a_spec_error():
    for bad in (b"s\x00\x00\x00\x00\x00\x00\x00\x01\xff", b"i\x00\x00\x00\x00\x00\x00\x00\x01x", "text"):
        with pytest.raises(SpecError):
            decode(bad)
    with pytest.raises(SpecError):
        h_task(D1, {}, 5)
    with pytest.raises(SpecError):
        call_identity("inference", D1, SAMPLING, {"prompt": "not bytes"}, GPU)
    with pytest.raises(SpecError):
        call_identity("inference", D1, SAMPLING, [b"x"], GPU)
    with pytest.raises(SpecError):
        call_identity("inference", D1, ["not", "a", "mapping"], {}, GPU)
    with pytest.raises(SpecError):
        task_identity("not a task", D1)
