"""code_reward: a GRPOTrainer reward function grading completions in sandboxes of a real
pool (podman, the Debian image), with result reuse, per-completion timeouts and reward 0
on infrastructure failures; then a REAL GRPO step of TRL on the CPU with it, on a tiny
random model built here (flowmesh_sdk.testing.tiny_model, nothing downloaded) whose
vocabulary is two words, so that every group of completions holds a duplicate."""

from __future__ import annotations

import asyncio
import logging
import os

import pytest

from flowmesh_sdk import SandboxSpec
from flowmesh_sdk.errors import SpecError
from flowmesh_sdk.integrations.trl import CodeReward, code_reward, extract_code
from flowmesh_sdk.specs import InfraFailure, ReuseKind
from flowmesh_sdk.testing.tiny_model import OFFLINE_ENV, build_tiny_lm
from conftest import local_pool  # noqa: E402

TESTS = "from answer import VALUE\nassert VALUE == 2, VALUE\n"
HANG = "import time\ntime.sleep(60)\nVALUE = 2\n"


@pytest.fixture(scope="module")
async def fleet_pool(tmp_path_factory, swe_image):
    async with local_pool(tmp_path_factory.mktemp("fmhome-trl"), "rewards", sandboxes_per_instance=4) as fp:
        yield fp


def _spec(image: str) -> SandboxSpec:
    return SandboxSpec(image=image, cpus=0.5, memory_gb=0.5)


def test_extract_code():
    assert extract_code("So:\n```python\nx = 1\n```\nor\n```\ny = 2\n```") == "y = 2\n"
    assert extract_code("x = 1") == "x = 1"
    assert extract_code([{"role": "assistant", "content": "```py\nz = 3\n```"}]) == "z = 3\n"


async def test_rewards_reuse_timeouts_and_infra_failures(fleet_pool, swe_image, caplog):
    fleet, pool = fleet_pool
    reward = code_reward(fleet, pool, spec=_spec(swe_image), timeout_s=2)
    completions = ["Here:\n```python\nVALUE = 2\n```", "VALUE = 3", HANG, "Again:\n```python\nVALUE = 2\n```",
                   "VALUE = (", "VALUE = 2"]
    caplog.set_level(logging.WARNING, logger="flowmesh.integrations.trl")
    rewards = await reward(prompts=["p"] * 6, completions=completions, tests=[TESTS] * 6)
    assert rewards == [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    out = reward.last
    assert [o.reason for o in out] == ["passed", "failed (exit 1)", "timed out after 2 s", "passed",
                                       "failed (exit 1)", "passed"]
    assert "completion 2: timed out after 2 s" in caplog.text
    # completions 0 and 3 hold the same code: one sandbox ran it
    assert out[0].h_task == out[3].h_task and out[0].h_task != out[5].h_task
    assert sorted([out[0].reuse, out[3].reuse]) == sorted([ReuseKind.EXECUTED, ReuseKind.JOINED])
    assert out[0].task_id == out[3].task_id
    executed = [o for o in out if o.reuse is ReuseKind.EXECUTED]
    assert len(executed) == 5 and all(o.instance_id for o in executed)

    # the same batch again: every verdict comes from the store; the timeout runs again
    again = await reward(prompts=["p"] * 6, completions=completions, tests=[TESTS] * 6)
    assert again == rewards
    assert [o.reuse for o in reward.last] == [ReuseKind.HIT, ReuseKind.HIT, ReuseKind.EXECUTED, ReuseKind.HIT,
                                              ReuseKind.HIT, ReuseKind.HIT]
    assert reward.stats.completions == 12 and reward.stats.executed == 6 and reward.stats.timeouts == 2

    # infrastructure failure (the image does not exist): no reward (TRL's None: masked), the reason, no exception
    broken = code_reward(fleet, pool, spec=_spec("localhost/flowmesh/no-such-image:1"), timeout_s=2)
    assert await broken(prompts=["p", "p"], completions=["VALUE = 2", "x"], tests=[TESTS, TESTS]) == [None, None]
    assert all(o.infra_failure and o.infra_kind is InfraFailure.IMAGE_PULL and "ImageNotFoundError" in o.reason
               for o in broken.last)
    assert "ImageNotFoundError" in caplog.text
    # or a value of the caller's choosing: scored as a failure
    scored = code_reward(fleet, pool, spec=_spec("localhost/flowmesh/no-such-image:1"), timeout_s=2,
                         infra_reward=0.0)
    assert await scored(prompts=["p"], completions=["VALUE = 2"], tests=[TESTS]) == [0.0]
    assert scored.stats.infra_failures == 1

    with pytest.raises(SpecError, match="reward.tests"):
        await reward(prompts=["p"], completions=["x"])
    with pytest.raises(SpecError, match="reward.image"):
        code_reward(fleet, pool)


async def test_grpo_step_with_sandbox_rewards(fleet_pool, swe_image, tmp_path):
    for mod in ("torch", "transformers", "trl", "datasets"):
        pytest.importorskip(mod)
    os.environ.update(OFFLINE_ENV)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    fleet, pool = fleet_pool
    lm = build_tiny_lm(tmp_path / "tiny", texts=["good bad good", "bad good bad"])
    # the row's tests: prompt A rewards the answer "good"; prompt B's tests hang (a timeout)
    tests_a = "w = open('/work/answer.py').read().strip()\nassert w == 'good', w\n"
    tests_b = "import time\ntime.sleep(60)\n"
    ds = Dataset.from_list([{"prompt": "good bad good", "tests": tests_a},
                            {"prompt": "bad good bad", "tests": tests_b}])
    reward = code_reward(fleet, pool, spec=_spec(swe_image), timeout_s=3)
    assert isinstance(reward, CodeReward)
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=1, learning_rate=1e-3, logging_steps=1,
                      report_to="none", disable_tqdm=True, use_cpu=True, save_strategy="no", seed=0,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=str(lm.model), reward_funcs=[reward], args=args, train_dataset=ds)
    await asyncio.to_thread(trainer.train)          # the reward hops back to this loop

    assert trainer.state.global_step == 1           # the step went on through the timeouts
    out = reward.last
    assert reward.stats.batches == 1 and len(out) == 8
    for o in out:
        assert o.reuse in (ReuseKind.EXECUTED, ReuseKind.JOINED, ReuseKind.HIT) and o.task_id
        assert o.answer in ("", "good", "bad")
    logged = [h for h in trainer.state.log_history if "rewards/flowmesh_code_reward/mean" in h]
    assert logged and logged[0]["rewards/flowmesh_code_reward/mean"] == pytest.approx(
        sum(o.reward for o in out) / len(out))
    group_b = [o for o in out if o.tests == tests_b]
    assert len(group_b) == 4 and all(o.reward == 0.0 and o.reason == "timed out after 3 s" for o in group_b)
    group_a = [o for o in out if o.tests == tests_a]
    assert len(group_a) == 4
    assert all(o.reward == (1.0 if o.answer == "good" else 0.0) for o in group_a)
    # 4 completions, at most 3 distinct texts ("", "good", "bad"): a duplicate, run once
    distinct = {o.h_task for o in group_a}
    assert len(distinct) < 4
    for h in distinct:
        runs = [o for o in group_a if o.h_task == h]
        assert sum(o.reuse is ReuseKind.EXECUTED for o in runs) == 1
        assert len({o.task_id for o in runs}) == 1 and len({o.answer for o in runs}) == 1
    assert reward.stats.executed == len(distinct) + 4    # timed-out runs are never shared
