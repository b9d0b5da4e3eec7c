"""Rewards for TRL's ``GRPOTrainer`` computed in FlowMesh sandboxes (extra ``[train]``).

:func:`code_reward` makes a reward function: for each completion it writes the code
answer (the last fenced code block, or the whole text) and the row's tests into a fresh
sandbox of a pool, runs the tests, and rewards 1.0 when they pass (or what ``reward_of``
says).  The completions of a step run concurrently (the pool's capacity bounds how many at
once), each under its own timeout, through the fleet's result reuse: an identical
completion for the same tests (the same ``H_task``) runs once -- joined while in flight,
answered from the store afterwards, in this step or a later one.  A completion whose
sandbox times out gets reward 0.  One whose run the infrastructure ended
(``TaskResult.infra_failure``: preempted, instance lost, image pull, capacity, budget, ...;
or no answer within ``wait_s``) gets ``infra_reward`` -- by default ``None``, TRL's "no
reward" (``GRPOTrainer`` turns it into NaN and leaves it out of the group's statistics), so
a rollout the infrastructure broke is masked, not scored zero -- and a logged reason,
instead of crashing the training step.

    from flowmesh_sdk.integrations.trl import code_reward
    reward = code_reward(fleet, pool, image="localhost/flowmesh/swe-base:bookworm", timeout_s=10)
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=ds)   # ds has a "tests" column

The function is async (TRL runs it on its own event loop); it hops to the loop the pool
belongs to, so make it in async code on that loop (or from a ``flowmesh_sdk.sync`` fleet
and pool) and run ``trainer.train()`` in a worker thread
(``await asyncio.to_thread(trainer.train)``).  TRL is not imported here: any trainer
that calls ``reward(prompts=..., completions=..., **columns)`` can use it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import FlowMeshError, SpecError
from ..specs import ExecResult, InfraFailure, ReuseKind, SandboxSpec, Task, TaskResult, check_number
from ._bridge import LoopBridge

__all__ = ["CodeReward", "RewardOutcome", "RewardStats", "code_reward", "extract_code", "passed"]

log = logging.getLogger("flowmesh.integrations.trl")

DEFAULT_ANSWER_PATH = "/work/answer.py"
DEFAULT_TESTS_PATH = "/work/test_answer.py"
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", re.S)


def extract_code(completion: Any) -> str:
    """The code in a completion: the last fenced block (```python ... ```) if there is one,
    else the whole text.  A conversational completion (a list of messages) gives its last
    message's content."""
    if isinstance(completion, list):
        completion = completion[-1].get("content", "") if completion else ""
    text = completion if isinstance(completion, str) else str(completion)
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def passed(result: ExecResult) -> float:
    """The default reward: 1.0 when the tests exit 0, else 0.0."""
    return 1.0 if result.exit_code == 0 and not result.timed_out else 0.0


@dataclass(frozen=True)
class RewardOutcome:
    """How one completion was scored."""

    index: int
    answer: str                    # the code that was graded
    reward: float | None           # None: masked (an infrastructure failure, with infra_reward=None)
    reason: str                    # "passed", "failed (exit 1)", "timed out after 5 s", "infra: ..."
    reuse: ReuseKind | None = None  # EXECUTED, JOINED (same work in flight) or HIT (from the store)
    h_task: str | None = None
    exit_code: int | None = None
    task_id: str | None = None     # the run that computed the result
    instance_id: str | None = None  # where it ran (None for a hit or a join)
    infra_failure: bool = False
    tests: str = ""                # the row's tests it was graded against
    infra_kind: InfraFailure | None = None   # what the infrastructure did (None: no answer in time)


@dataclass
class RewardStats:
    """Totals over every call of one reward function."""

    completions: int = 0
    executed: int = 0
    reused: int = 0                # joined or hit: no sandbox ran for them
    timeouts: int = 0
    infra_failures: int = 0
    batches: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


class CodeReward:
    """The reward function :func:`code_reward` returns (an async callable)."""

    def __init__(self, reuse: Any, pool: Any, spec: SandboxSpec, bridge: LoopBridge, *,
                 tests_column: str, answer_path: str, tests_path: str, command: str, timeout_s: float,
                 wait_s: float, tenant: str, extract: Callable[[Any], str],
                 reward_of: Callable[[ExecResult], float], name: str, history: int,
                 infra_reward: float | None = None) -> None:
        self.reuse = reuse
        self.pool = pool
        self.spec = spec
        self.bridge = bridge
        self.tests_column = tests_column
        self.answer_path = answer_path
        self.tests_path = tests_path
        self.command = command
        self.timeout_s = timeout_s
        self.wait_s = wait_s
        self.tenant = tenant
        self.extract = extract
        self.reward_of = reward_of
        self.infra_reward = infra_reward
        self.__name__ = name          # TRL names the reward's metrics after it
        self.stats = RewardStats()
        self.last: list[RewardOutcome] = []
        #: the outcomes of the last ``history`` calls (one list per training step's batch)
        self.history: collections.deque[list[RewardOutcome]] = collections.deque(maxlen=history)

    def __repr__(self) -> str:
        return f"CodeReward({self.__name__}, pool={getattr(self.pool, 'name', '?')}, image={self.spec.image!r})"

    async def __call__(self, prompts: Sequence[Any], completions: Sequence[Any],
                       **kwargs: Any) -> list[float | None]:
        tests = kwargs.get(self.tests_column)
        if tests is None or len(tests) != len(completions):
            raise SpecError(f"reward.{self.tests_column}", "the dataset needs a column of that name with one "
                                                          f"entry per completion (got {type(tests).__name__})")
        outcomes = await self.bridge.hop(self.score(list(completions), [str(t) for t in tests]))
        self.last = outcomes
        self.history.append(outcomes)
        log_extra, log_metric = kwargs.get("log_extra"), kwargs.get("log_metric")
        if callable(log_extra):
            log_extra("flowmesh_reason", [o.reason for o in outcomes])
        if callable(log_metric):
            log_metric("flowmesh/infra_failures", float(sum(o.infra_failure for o in outcomes)))
            log_metric("flowmesh/executed", float(sum(o.reuse is ReuseKind.EXECUTED for o in outcomes)))
        return [o.reward for o in outcomes]

    async def score(self, completions: list[Any], tests: list[str]) -> list[RewardOutcome]:
        """Score every completion concurrently (on the pool's loop)."""
        outcomes = list(await asyncio.gather(*(self._one(i, c, t) for i, (c, t) in
                                               enumerate(zip(completions, tests)))))
        st = self.stats
        st.batches += 1
        for o in outcomes:
            st.completions += 1
            st.executed += o.reuse is ReuseKind.EXECUTED
            st.reused += o.reuse in (ReuseKind.JOINED, ReuseKind.HIT)
            st.timeouts += o.reason.startswith("timed out")
            st.infra_failures += o.infra_failure
            key = o.reason.split(":", 1)[0]
            st.reasons[key] = st.reasons.get(key, 0) + 1
        return outcomes

    async def _one(self, i: int, completion: Any, tests: str) -> RewardOutcome:
        answer = self.extract(completion)
        task = Task(name=f"{self.__name__}-{i}", sandbox=self.spec, command=self.command,
                    files={self.answer_path: answer.encode(), self.tests_path: tests.encode()},
                    timeout_s=self.timeout_s, tenant=self.tenant, deterministic=True)
        try:
            tr: TaskResult = await asyncio.wait_for(self.reuse.run(task, self.pool, cache_failures=True),
                                                    self.wait_s)
        except (FlowMeshError, OSError, TimeoutError) as exc:
            what = (f"no result within {self.wait_s:g} s" if isinstance(exc, TimeoutError)
                    else f"{type(exc).__name__}: {exc}")
            return self._infra(i, answer, f"infra: {what}", None, tests=tests)
        prov = tr.provenance
        ran: dict[str, Any] = {"reuse": tr.reuse, "h_task": prov.h_task if prov else None,
                               "task_id": prov.task_id if prov else tr.task_id, "instance_id": tr.instance_id}
        r = tr.result
        if tr.infra_failure is not None:
            return self._infra(i, answer, f"infra: {tr.infra_failure.value}: {tr.error}", tr.infra_failure,
                               tests=tests, **ran)
        if tr.error is not None or r is None:   # its sandbox failed under its own command: its outcome
            return self._zero(i, answer, f"error: {tr.error or 'no result'}", tests=tests, **ran)
        if r.timed_out:
            return self._zero(i, answer, f"timed out after {self.timeout_s:g} s", exit_code=r.exit_code,
                              tests=tests, **ran)
        reward = float(self.reward_of(r))
        reason = "passed" if r.exit_code == 0 else f"failed (exit {r.exit_code})"
        return RewardOutcome(i, answer, reward, reason, exit_code=r.exit_code, tests=tests, **ran)

    def _zero(self, i: int, answer: str, reason: str, **base: Any) -> RewardOutcome:
        log.warning("%s: reward 0 for completion %d: %s", self.__name__, i, reason)
        return RewardOutcome(i, answer, 0.0, reason, **base)

    def _infra(self, i: int, answer: str, reason: str, kind: InfraFailure | None, **base: Any) -> RewardOutcome:
        log.warning("%s: reward %s for completion %d: %s", self.__name__, self.infra_reward, i, reason)
        return RewardOutcome(i, answer, self.infra_reward, reason, infra_failure=True, infra_kind=kind, **base)


def code_reward(fleet: Any, pool: Any, *, image: str | None = None, spec: SandboxSpec | None = None,
                tests_column: str = "tests", answer_path: str = DEFAULT_ANSWER_PATH,
                tests_path: str = DEFAULT_TESTS_PATH, command: str | None = None, timeout_s: float = 30.0,
                wait_s: float = 600.0, tenant: str = "default",
                extract: Callable[[Any], str] = extract_code,
                reward_of: Callable[[ExecResult], float] = passed,
                name: str = "flowmesh_code_reward", history: int = 16,
                infra_reward: float | None = None) -> CodeReward:
    """A ``GRPOTrainer`` reward function grading each completion in a sandbox of ``pool``.

    ``fleet`` gives the result reuse (``fleet.results``); ``fleet`` and ``pool`` may be
    async objects (call this in async code on their loop) or ``flowmesh_sdk.sync`` ones.
    The sandbox is ``spec``, or ``pool.default_sandbox(image)``.  Each completion's code
    goes to ``answer_path`` and the row's ``tests_column`` to ``tests_path``; ``command``
    (default ``python3 -B TESTS_PATH``: the tests ``import answer``) runs under
    ``timeout_s``; ``wait_s`` bounds the whole request (queueing included).  ``reward_of``
    maps a finished run's ``ExecResult`` to the reward (default: 1.0 if exit 0);
    ``infra_reward`` is what a completion the infrastructure failed gets (default None:
    masked, TRL's convention; 0.0 scores it as a failure).  The
    function keeps ``stats`` (totals), ``last`` (the last batch's :class:`RewardOutcome` records)
    and ``history`` (the last ``history`` batches)."""
    inner_pool, inner_fleet = getattr(pool, "pool", pool), getattr(fleet, "fleet", fleet)
    if not callable(getattr(inner_pool, "run_task", None)):
        raise SpecError("reward.pool", f"must be a FlowMesh pool, got {type(pool).__name__}")
    reuse = getattr(inner_fleet, "results", None)
    if reuse is None:
        raise SpecError("reward.fleet", f"must be a FlowMesh Fleet (its results layer), got {type(fleet).__name__}")
    if (image is None) == (spec is None):
        raise SpecError("reward.image", "give exactly one of image= or spec=")
    check_number("reward.timeout_s", timeout_s, lo=0, hi=7 * 86400, lo_open=True)
    check_number("reward.wait_s", wait_s, lo=0, lo_open=True)
    check_number("reward.history", history, lo=1, integer=True)
    if infra_reward is not None:
        check_number("reward.infra_reward", infra_reward, lo=-1e9, hi=1e9)
    for fname, path in (("reward.answer_path", answer_path), ("reward.tests_path", tests_path)):
        if not isinstance(path, str) or not path.startswith("/"):
            raise SpecError(fname, f"must be an absolute path, got {path!r}")
    sb_spec = spec if spec is not None else inner_pool.default_sandbox(image)
    bridge = LoopBridge.of(pool)
    return CodeReward(reuse, inner_pool, sb_spec, bridge, tests_column=tests_column, answer_path=answer_path,
                      tests_path=tests_path, command=command or f"python3 -B {tests_path}", timeout_s=timeout_s,
                      wait_s=wait_s, tenant=tenant, extract=extract, reward_of=reward_of, name=name,
                      history=history, infra_reward=infra_reward)
