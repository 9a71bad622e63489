"""A slime-style synchronous reward runs off the event loop, under --reward-timeout."""

from __future__ import annotations

import asyncio
import time

from actors.rollout.config import RolloutConfig
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.sample import Sample, Status


class Ctx:
    tokenizer = None
    router_url = "http://127.0.0.1:31234"


async def test_a_sync_slime_reward_that_overruns_the_timeout_fails_its_sample_and_never_stalls_the_loop():
    config = RolloutConfig(custom_rm_path="slime_style_plugin.slow_rm", reward_timeout=0.2)
    scorer = RewardScorer(config, Ctx(), SlimePlugins(config, Ctx()))
    sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 2, 3], response_length=1, loss_mask=[1],
                    rollout_logprobs=[0.0], token_versions=[0], status=Status.COMPLETED)
    ticks = 0

    async def ticker() -> None:  # counts while the reward runs: a blocked loop would count nothing
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    task = asyncio.ensure_future(ticker())
    started = time.monotonic()
    await scorer.score_group([sample])
    elapsed = time.monotonic() - started
    task.cancel()
    assert elapsed < 0.8, f"the reward held the caller {elapsed:.2f} s, past --reward-timeout 0.2"
    assert ticks >= 5
    assert scorer.errors == 1 and sample.reward == 0.0
