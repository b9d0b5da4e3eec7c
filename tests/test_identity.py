"""Canonical encoding and the two operator identities (H_task, H_exec).

The golden vectors below were computed once with flowmesh_sdk.identity (encoding v1) and
pinned: a change to any of them changes every stored identity, and must come with a new
encoding version (docs/identity.md).
"""

from __future__ import annotations

import json
import os
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
    ("e\u0301", "730000000000000002c3a9"),       # NFC: the same string as above
    (b"\x00\xff", "62000000000000000200ff"),
    ([1, "a"], "6c00000000000000026900000000000000013173000000000000000161"),
    ({"b": 1, "a": [None]},
     "640000000000000002730000000000000001616c00000000000000014e7300000000000000016269000000000000000131"),
]

GOLDEN_H_TASK = "sha256:80fc4d4e1c1e991af4c104f98e58c604b1212960cedf0d8518eefcc82b065d6b"
GOLDEN_H_EXEC = "sha256:4e73a8140ff5d422be356c3bb458587189621c45afa8207efbb1cc863cd84683"
GOLDEN_LABEL = "sha256:50ce384ec48e3aff4337bacfae985a482e600a2e1784ab74807cced63cd8126c"
GOLDEN_TASK_H_TASK = "sha256:5be16bfd6bff5e12b70faf4770366cbcbd5eacc91063409300bdb77e90bc5b55"
GOLDEN_TASK_H_EXEC = "sha256:d215be92ba6d1d5611e022069609d59e4af35642843f330e95bc1e56840f4ca6"
GOLDEN_CALL_H_TASK = "sha256:a714cfc35cd57aacb28453654e71ac23a0ceb9363f063eb75a50e1238185d40a"
GOLDEN_CALL_H_EXEC = "sha256:3d7a1bf20a2b2a1169f6755e7307cfa97d2550ff34faffba6c15d4f71538d0c2"
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
    ("\ud800", "value"), ({"e\u0301": 1, "\u00e9": 2}, "value"),
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
