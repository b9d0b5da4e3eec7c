"""Workflows of operators: a small DAG whose edges carry one operator's output into another.

::

    wf = Workflow("grpo-a", tenant="alice")
    roll = wf.sandbox("rollout-0", pool="cpu", image=IMG, command="python3 agent.py",
                      seed=7)                                     # stdout is its output
    test = wf.sandbox("test-0", pool="cpu", image=IMG, command="sh /run-tests.sh",
                      inputs={"/work/patch.diff": roll}, deterministic=True)
    wf.call("reward-0", reward_fn, image_or_model=label_digest("reward@1"),
            inputs={"verdict": test}, deterministic=True)
    run = await wf.run(fleet.results, pools={"cpu": pool})
    run.output("reward-0"), run.lineage

Three kinds of operator: a **sandbox task** (a command in a container of a pool; its
output is its stdout, its inputs are written as files before it runs), and in-process
**calls** -- an inference call, a training step, any function -- whose output is the
bytes the function returns.  Every operator goes through the reuse layer
(:class:`~flowmesh_sdk.reuse.ResultReuse`), so work another workflow (or tenant) already
did or is doing is not done twice; the run keeps per-workflow lineage: which operator
asked for which ``H_task`` and which result (computed by whom) it got.

Everything that can be checked is checked before anything runs: a missing input, a
cycle, an unknown pool, an image that does not resolve -- each raises SpecError naming
the operator.  Then operators run by readiness: each starts the moment its inputs are
done, on its own pool; an operator whose input failed is skipped, not run.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import FlowMeshError, SpecError
from ..identity import check_digest
from ..reuse import CallResult, LineageEntry, ResultReuse, TaskRunner
from ..specs import Provenance, ReuseKind, SandboxSpec, Task, TaskResult

__all__ = ["CallOp", "OpOutcome", "OpRef", "SandboxOp", "Workflow", "WorkflowRun"]

CALL_KINDS = ("call", "inference", "train")


@dataclass(frozen=True, slots=True)
class OpRef:
    """A handle on an operator of a workflow, to use as another operator's input."""

    name: str


InputRef = OpRef | str


@dataclass(frozen=True, slots=True)
class SandboxOp:
    name: str
    pool: str
    sandbox: SandboxSpec | None          # None: the pool's default sandbox for ``image``
    image: str
    command: str
    inputs: Mapping[str, str]            # path in the sandbox -> upstream operator
    files: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    timeout_s: float | None = None
    deterministic: bool = False
    seed: int | None = None
    ok_exit_codes: tuple[int, ...] = (0,)


@dataclass(frozen=True, slots=True)
class CallOp:
    name: str
    fn: Callable[[Mapping[str, bytes]], Any] = field(repr=False)
    kind: str
    image_or_model: str
    params: Mapping[str, Any]
    inputs: Mapping[str, str]            # input name -> upstream operator
    resource_class: Any = "cpu"
    deterministic: bool = False
    seed: int | None = None


Op = SandboxOp | CallOp


@dataclass(frozen=True, slots=True)
class OpOutcome:
    """What one operator of a run came to.  ``state`` is ``succeeded``, ``failed`` or
    ``skipped`` (an input failed); ``output`` its stdout (sandbox) or returned bytes (call)."""

    name: str
    state: str
    output: bytes | None
    reuse: ReuseKind | None
    h_task: str | None
    provenance: Provenance | None
    error: str | None
    result: TaskResult | CallResult | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """One run of a workflow: every operator's outcome, in topological order, and the
    lineage of this run's requests (as the reuse layer recorded them)."""

    workflow: str
    tenant: str
    ops: Mapping[str, OpOutcome]
    lineage: tuple[LineageEntry, ...]

    @property
    def ok(self) -> bool:
        return all(o.state == "succeeded" for o in self.ops.values())

    def output(self, name: str) -> bytes:
        """The output of operator ``name``; KeyError if unknown, FlowMeshError if it did not succeed."""
        out = self.ops[name]
        if out.state != "succeeded" or out.output is None:
            raise FlowMeshError(f"workflow {self.workflow!r}: operator {name!r} {out.state}"
                                + (f": {out.error}" if out.error else ""))
        return out.output

    def count(self, kind: ReuseKind) -> int:
        return sum(1 for o in self.ops.values() if o.reuse is kind)


class Workflow:
    """A DAG of operators built by calling :meth:`sandbox`, :meth:`call`, :meth:`inference`
    and :meth:`train`; run with :meth:`run`.  Inputs may name operators added later (as
    strings), so a workflow can be built in any order; :meth:`order` checks it."""

    def __init__(self, name: str, *, tenant: str = "default") -> None:
        if not isinstance(name, str) or not name:
            raise SpecError("workflow.name", f"must be a non-empty string, got {name!r}")
        if not isinstance(tenant, str) or not tenant:
            raise SpecError("workflow.tenant", f"must be a non-empty string, got {tenant!r}")
        self.name = name
        self.tenant = tenant
        self.ops: dict[str, Op] = {}

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, tenant={self.tenant!r}, ops={len(self.ops)})"

    # ---- building ------------------------------------------------------------------
    def _check_new(self, name: object) -> str:
        if not isinstance(name, str) or not name:
            raise SpecError("workflow.op.name", f"must be a non-empty string, got {name!r}")
        if name in self.ops:
            raise SpecError(f"workflow.ops[{name!r}]", f"workflow {self.name!r} already has an operator "
                                                      "of that name")
        return name

    def _refs(self, name: str, inputs: Mapping[str, InputRef] | None) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, ref in (inputs or {}).items():
            target = ref.name if isinstance(ref, OpRef) else ref
            if not isinstance(target, str) or not target:
                raise SpecError(f"workflow.ops[{name!r}].inputs[{key!r}]",
                                f"must name an operator (OpRef or its name), got {ref!r}")
            out[str(key)] = target
        return out

    def sandbox(self, name: str, *, pool: str, command: str, image: str | None = None,
                sandbox: SandboxSpec | None = None, inputs: Mapping[str, InputRef] | None = None,
                files: Mapping[str, bytes] | None = None, timeout_s: float | None = None,
                deterministic: bool = False, seed: int | None = None,
                ok_exit_codes: tuple[int, ...] = (0,)) -> OpRef:
        """A command in a container of pool ``pool``: ``sandbox=`` a SandboxSpec, or ``image=``
        for the pool's default sandbox of that image (``pool.default_sandbox``).  ``inputs``
        maps an absolute path in the sandbox to the operator whose output is written there
        before the command runs."""
        self._check_new(name)
        if (image is None) == (sandbox is None):
            raise SpecError(f"workflow.ops[{name!r}].sandbox", "give exactly one of image= or sandbox=")
        if sandbox is not None and not isinstance(sandbox, SandboxSpec):
            raise SpecError(f"workflow.ops[{name!r}].sandbox", "must be a SandboxSpec")
        if sandbox is not None:
            spec = sandbox
        else:
            assert image is not None   # exactly one of image= and sandbox=, checked above
            spec = SandboxSpec(image=image)
        refs = self._refs(name, inputs)
        static = dict(files or {})
        for path in refs:
            if not path.startswith("/"):
                raise SpecError(f"workflow.ops[{name!r}].inputs[{path!r}]", "must be an absolute path")
            if path in static:
                raise SpecError(f"workflow.ops[{name!r}].inputs[{path!r}]", "is also one of its files")
        if not isinstance(pool, str) or not pool:
            raise SpecError(f"workflow.ops[{name!r}].pool", f"must name a pool, got {pool!r}")
        if not ok_exit_codes or not all(isinstance(c, int) for c in ok_exit_codes):
            raise SpecError(f"workflow.ops[{name!r}].ok_exit_codes", "must be a non-empty tuple of ints")
        # build a Task once now so its fields are validated before anything runs
        Task(name=name, sandbox=spec, command=command, files={**static, **{p: b"" for p in refs}},
             timeout_s=timeout_s, tenant=self.tenant, deterministic=deterministic, seed=seed)
        self.ops[name] = SandboxOp(name, pool, sandbox, spec.image, command, MappingProxyType(refs),
                                   MappingProxyType(static), timeout_s, deterministic, seed,
                                   tuple(ok_exit_codes))
        return OpRef(name)

    def call(self, name: str, fn: Callable[[Mapping[str, bytes]], Any], *, image_or_model: str,
             params: Mapping[str, Any] | None = None, inputs: Mapping[str, InputRef] | None = None,
             resource_class: Any = "cpu", kind: str = "call", deterministic: bool = False,
             seed: int | None = None) -> OpRef:
        """An in-process operator: ``fn({input name: bytes}) -> bytes`` (sync or async).
        ``image_or_model`` is a digest of what computes it (model weights, an image, or
        ``label_digest("my-fn@2")`` for a plain function)."""
        self._check_new(name)
        if not callable(fn):
            raise SpecError(f"workflow.ops[{name!r}].fn", "must be callable")
        if kind not in CALL_KINDS:
            raise SpecError(f"workflow.ops[{name!r}].kind", f"must be one of {', '.join(CALL_KINDS)}; "
                                                          f"got {kind!r}")
        try:
            check_digest("image_or_model", image_or_model)
        except SpecError as exc:
            raise SpecError(f"workflow.ops[{name!r}].image_or_model", str(exc).split(": ", 1)[1]) from None
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise SpecError(f"workflow.ops[{name!r}].seed", f"must be a non-negative integer, got {seed!r}")
        self.ops[name] = CallOp(name, fn, kind, image_or_model, MappingProxyType(dict(params or {})),
                                MappingProxyType(self._refs(name, inputs)), resource_class,
                                deterministic, seed)
        return OpRef(name)

    def inference(self, name: str, fn: Callable[[Mapping[str, bytes]], Any], **kw: Any) -> OpRef:
        """An inference call (``kind="inference"``): ``image_or_model`` is the model digest,
        ``params`` the sampling parameters, the prompt an input."""
        return self.call(name, fn, kind="inference", **kw)

    def train(self, name: str, fn: Callable[[Mapping[str, bytes]], Any], **kw: Any) -> OpRef:
        """A training step (``kind="train"``): its output is typically a checkpoint's bytes."""
        return self.call(name, fn, kind="train", **kw)

    # ---- checking ------------------------------------------------------------------
    def order(self) -> list[str]:
        """The operators in a topological order (ties in the order they were added).
        SpecError for an input naming no operator, or for a cycle (the cycle is named)."""
        for op in self.ops.values():
            for key, up in op.inputs.items():
                if up not in self.ops:
                    raise SpecError(f"workflow.ops[{op.name!r}].inputs[{key!r}]",
                                    f"names {up!r}, which is not an operator of workflow {self.name!r}")
        order: list[str] = []
        state: dict[str, int] = {}           # 1: on the current path, 2: done

        def visit(n: str, path: list[str]) -> None:
            if state.get(n) == 2:
                return
            if state.get(n) == 1:
                cycle = path[path.index(n):] + [n]
                raise SpecError(f"workflow.ops[{n!r}].inputs",
                                f"workflow {self.name!r} has a cycle: {' -> '.join(cycle)}")
            state[n] = 1
            for up in self.ops[n].inputs.values():
                visit(up, path + [n])
            state[n] = 2
            order.append(n)

        for n in self.ops:
            visit(n, [])
        return order

    # ---- running -------------------------------------------------------------------
    async def run(self, reuse: ResultReuse, pools: Mapping[str, TaskRunner] | None = None, *,
                  cache_failures: bool | None = None) -> WorkflowRun:
        """Check everything, then run every operator by readiness through ``reuse``.
        ``pools`` maps the pool names the sandbox operators use to pools."""
        pools = dict(pools or {})
        order = self.order()
        await self._preflight(reuse, pools)
        done: dict[str, asyncio.Future[OpOutcome]] = {
            n: asyncio.get_running_loop().create_future() for n in order}
        request_ids = {n: secrets.token_hex(8) for n in order}

        async def one(n: str) -> None:
            op = self.ops[n]
            try:
                ups = {key: await asyncio.shield(done[up]) for key, up in op.inputs.items()}
                failed = [f"{u.name} {u.state}" for u in ups.values() if u.state != "succeeded"]
                if failed:
                    out = OpOutcome(n, "skipped", None, None, None, None, f"input {', '.join(failed)}")
                elif isinstance(op, SandboxOp):
                    out = await self._run_sandbox(op, ups, reuse, pools[op.pool], request_ids[n],
                                                  cache_failures)
                else:
                    out = await self._run_call(op, ups, reuse, request_ids[n])
            except BaseException as exc:
                if not done[n].done():
                    done[n].set_result(OpOutcome(n, "failed", None, None, None, None,
                                                 f"{type(exc).__name__}: {exc}"))
                raise
            done[n].set_result(out)

        # every operator settles (a failure skips its dependants) before an unexpected
        # error, if any, is raised: nothing is left running behind the caller's back
        outcomes = await asyncio.gather(*(one(n) for n in order), return_exceptions=True)
        errors = [e for e in outcomes if isinstance(e, BaseException)]
        if errors:
            raise errors[0]
        ops = {n: done[n].result() for n in order}
        wanted = set(request_ids.values())
        lineage = tuple(e for e in reuse.lineage(workflow=self.name) if e.request_id in wanted)
        return WorkflowRun(self.name, self.tenant, MappingProxyType(ops), lineage)

    async def _preflight(self, reuse: ResultReuse, pools: Mapping[str, TaskRunner]) -> None:
        """Unknown pools and images that do not resolve, before anything runs."""
        images: dict[tuple[str, str], str] = {}
        for op in self.ops.values():
            if isinstance(op, SandboxOp):
                if op.pool not in pools:
                    raise SpecError(f"workflow.ops[{op.name!r}].pool",
                                    f"{op.pool!r} is not among the pools given "
                                    f"({', '.join(sorted(pools)) or 'none'})")
                spec = getattr(pools[op.pool], "spec", None)
                arch = getattr(getattr(spec, "instance", None), "arch", "x86_64")
                images.setdefault((op.image, arch), op.name)
        if reuse.resolver is not None:
            for (image, arch), name in images.items():
                try:
                    await reuse.resolver.resolve(image, arch=arch)
                except FlowMeshError as exc:
                    raise SpecError(f"workflow.ops[{name!r}].sandbox.image",
                                    f"{image!r} does not resolve: {exc}") from exc

    async def _run_sandbox(self, op: SandboxOp, ups: Mapping[str, OpOutcome], reuse: ResultReuse,
                           pool: TaskRunner, request_id: str, cache_failures: bool | None) -> OpOutcome:
        files = {**op.files, **{path: ups[path].output or b"" for path in op.inputs}}
        spec = op.sandbox
        if spec is None:
            default = getattr(pool, "default_sandbox", None)
            spec = default(op.image) if callable(default) else SandboxSpec(image=op.image)
        task = Task(name=op.name, sandbox=spec, command=op.command, files=files,
                    timeout_s=op.timeout_s, tenant=self.tenant, deterministic=op.deterministic,
                    seed=op.seed)
        tr = await reuse.run(task, pool, workflow=self.name, cache_failures=cache_failures,
                             request_id=request_id)
        res = tr.result
        ok = tr.error is None and res is not None and not res.timed_out and res.exit_code in op.ok_exit_codes
        err = tr.error or (None if ok else ("timed out" if res and res.timed_out else
                                            f"exit code {res.exit_code if res else '?'}"))
        h = tr.provenance.h_task if tr.provenance else self._h_task_of(reuse, request_id)
        return OpOutcome(op.name, "succeeded" if ok else "failed",
                         res.stdout.encode() if res is not None else None, tr.reuse, h,
                         tr.provenance, err, tr)

    async def _run_call(self, op: CallOp, ups: Mapping[str, OpOutcome], reuse: ResultReuse,
                        request_id: str) -> OpOutcome:
        cr = await reuse.call(op.name, op.fn, image_or_model=op.image_or_model, params=op.params,
                              inputs={k: u.output or b"" for k, u in ups.items()},
                              resource_class=op.resource_class, kind=op.kind, tenant=self.tenant,
                              workflow=self.name, deterministic=op.deterministic, seed=op.seed,
                              request_id=request_id)
        h = cr.provenance.h_task if cr.provenance else self._h_task_of(reuse, request_id)
        return OpOutcome(op.name, "succeeded" if cr.ok else "failed", cr.output, cr.reuse, h,
                         cr.provenance, cr.error, cr)

    @staticmethod
    def _h_task_of(reuse: ResultReuse, request_id: str) -> str | None:
        for e in reversed(reuse.lineage()):
            if e.request_id == request_id:
                return e.h_task
        return None
