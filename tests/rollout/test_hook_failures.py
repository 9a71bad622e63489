"""A hook that raises mid-run: its own exception (type, message, the frame in the user's file) is
logged and counted, and the run goes on (a generate hook's prompt is retried, then dropped; a
reward's sample fails with reward 0); a generate hook that raises on every prompt ends the run
with that exception, not a spin."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import sys
import types

import pytest

from actors.buffer import BufferActor, BufferConfig
from actors.rollout.actor import MAX_CONSECUTIVE_FAILURES, MAX_GROUP_ATTEMPTS, RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.actor import Actor, ActorFailed, spawn
from slime_async.sample import Sample, Status


def parse_answer(sample):
    return int(sample.prompt)  # the user's bug: the prompt is not a number


async def agent_that_raises(ctx, sample, sampling_params):
    sample.label = parse_answer(sample)
    return sample


RAISING_LINE = inspect.getsourcelines(parse_answer)[1] + 1
WHERE = f"(at {__file__}:{RAISING_LINE} in parse_answer)"


class Router(Actor):
    """What the rollout asks of a router here: nothing (the hook never reaches it)."""

    name = "router"


class Prompts:
    def __init__(self, n: int):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=[1, 2, 3]) for i in range(n)]

    def next_prompt(self) -> Prompt | None:
        return self.prompts.pop(0) if self.prompts else None


async def start_rollout(prompts: int):
    router = await spawn(Router())
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=1))
    config = RolloutConfig(prompt_data="unused.jsonl", rollout_batch_size=1, n_samples_per_prompt=2,
                           custom_generate_function_path=f"{__name__}:agent_that_raises")
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=Prompts(prompts), tokenizer=None))
    rollout.tell("start")
    return rollout, (rollout, buffer, router)


async def test_a_generate_hook_that_raises_mid_run_is_logged_with_its_frame_counted_and_its_prompt_dropped(caplog):
    rollout, refs = await start_rollout(prompts=1)
    try:
        with caplog.at_level(logging.WARNING, logger="actors.rollout.actor"):
            for _ in range(500):  # each attempt fails at once; the third drops the prompt
                if any("dropped" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
        messages = [r.getMessage() for r in caplog.records if r.name == "actors.rollout.actor"]
        assert len(messages) == MAX_GROUP_ATTEMPTS, messages
        assert all(f"ValueError: invalid literal for int() with base 10: 'p0' {WHERE}" in m for m in messages)
        metrics = await rollout.ask("metrics")
        assert metrics["rollout/generation_errors"] == MAX_GROUP_ATTEMPTS
        assert metrics["rollout/groups_failed"] == 1
        assert rollout.actor.running  # the run goes on
    finally:
        for ref in refs:
            await ref.stop()


async def test_a_generate_hook_that_raises_on_every_prompt_ends_the_run_with_its_exception():
    rollout, refs = await start_rollout(prompts=MAX_CONSECUTIVE_FAILURES)
    try:
        with pytest.raises(ActorFailed) as failed:
            await asyncio.wait_for(rollout.wait(), 60)
        assert re.fullmatch(rf"{MAX_CONSECUTIVE_FAILURES} prompt groups in a row failed; last: ValueError: invalid "
                            rf"literal for int\(\) with base 10: 'p\d+' {re.escape(WHERE)}", str(failed.value.error))
    finally:
        for ref in refs:
            await ref.stop()


async def test_a_reward_that_raises_names_its_frame_and_its_sample_fails_with_reward_zero(monkeypatch):
    module = types.ModuleType("raising_reward")

    async def rm(ctx, sample):
        return parse_answer(sample)

    module.rm = rm
    monkeypatch.setitem(sys.modules, "raising_reward", module)
    config = RolloutConfig(custom_rm_path="raising_reward:rm")
    scorer = RewardScorer(config, None, SlimePlugins(config, None))
    sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 2], response_length=1, loss_mask=[1],
                    rollout_logprobs=[0.0], token_versions=[0], status=Status.COMPLETED)
    try:
        assert await scorer.score_group([sample])  # on_reward_error "zero": the group is kept
    finally:
        scorer.close()
    assert sample.status is Status.FAILED and sample.reward == 0.0 and scorer.errors == 1
    assert sample.metadata["reward_error"] == f"ValueError: invalid literal for int() with base 10: 'p' {WHERE}"
