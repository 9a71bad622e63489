"""Reward functions run off the supervisor's event loop under --reward-timeout, and a non-finite
reward is a reward error (the sample failed and counted), never a reward to train on."""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
import time
import types

import pytest

from actors.rollout.config import RolloutConfig
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.sample import Sample, Status


class Ctx:
    tokenizer = None
    router_url = "http://127.0.0.1:31234"


def register(monkeypatch, name: str, **functions) -> str:
    module = types.ModuleType(name)
    for key, value in functions.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return name


def group(n: int) -> list[Sample]:
    return [Sample(group_index=0, index=i, prompt="p", tokens=[1, 2, 3], response_length=1, loss_mask=[1],
                   rollout_logprobs=[0.0], token_versions=[0], status=Status.COMPLETED) for i in range(n)]


def scorer_for(monkeypatch, rm, **config) -> RewardScorer:
    register(monkeypatch, "reward_under_test", rm=rm)
    rollout = RolloutConfig(custom_rm_path="reward_under_test:rm", **config)
    return RewardScorer(rollout, Ctx(), SlimePlugins(rollout, Ctx()))


async def largest_heartbeat_gap(work) -> tuple[float, object]:
    """Run ``work`` beside a 20 ms heartbeat; the longest the loop went without a beat."""
    beats = [time.monotonic()]

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(0.02)
            beats.append(time.monotonic())

    task = asyncio.ensure_future(heartbeat())
    result = await work
    task.cancel()
    beats.append(time.monotonic())
    return max(b - a for a, b in zip(beats, beats[1:])), result


async def test_an_async_reward_that_blocks_in_time_sleep_never_freezes_the_loop_and_times_out_counted(monkeypatch):
    async def rm(ctx, sample):
        time.sleep(5)  # blocks whatever loop it runs on
        return 1.0

    scorer = scorer_for(monkeypatch, rm, reward_timeout=1.0)
    sample = group(1)
    gap, kept = await largest_heartbeat_gap(scorer.score_group(sample))
    scorer.close()
    assert gap < 0.5, f"the supervisor's loop stalled {gap:.2f} s"
    assert kept  # --on-reward-error zero: the group stays, the sample scores 0
    assert sample[0].status is Status.FAILED and sample[0].reward == 0.0
    assert "timed out after --reward-timeout 1 s" in sample[0].metadata["reward_error"]
    assert scorer.errors == 1 and scorer.timeouts == 1


async def test_a_sync_native_reward_runs_in_a_thread(monkeypatch):
    def rm(ctx, sample):
        time.sleep(0.3)
        return 0.25

    scorer = scorer_for(monkeypatch, rm)
    samples = group(2)
    gap, _ = await largest_heartbeat_gap(scorer.score_group(samples))
    assert gap < 0.2
    assert [s.reward for s in samples] == [0.25, 0.25] and scorer.errors == 0


async def test_the_reward_sees_the_callers_context_variables(monkeypatch):
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")

    async def rm(ctx, sample):
        return 1.0 if marker.get() == "set by the hook adapter" else 0.0

    scorer = scorer_for(monkeypatch, rm)
    marker.set("set by the hook adapter")
    samples = group(1)
    await scorer.score_group(samples)
    scorer.close()
    assert samples[0].reward == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_a_non_finite_reward_is_a_counted_reward_error(monkeypatch, bad):
    async def rm(ctx, sample):
        return bad if sample.index == 0 else 1.0

    scorer = scorer_for(monkeypatch, rm)
    samples = group(4)
    assert await scorer.score_group(samples)
    scorer.close()
    assert samples[0].status is Status.FAILED and samples[0].reward == 0.0
    assert "not a finite number" in samples[0].metadata["reward_error"]
    assert [s.reward for s in samples[1:]] == [1.0, 1.0, 1.0]
    assert scorer.errors == 1 and scorer.timeouts == 0


async def test_a_non_finite_reward_drops_its_group_with_on_reward_error_drop(monkeypatch):
    async def rm(ctx, sample):
        return float("nan") if sample.index == 1 else 1.0

    scorer = scorer_for(monkeypatch, rm, on_reward_error="drop")
    assert not await scorer.score_group(group(3))
    scorer.close()
    assert scorer.errors == 1


async def test_a_group_reward_with_a_nan_fails_the_group(monkeypatch):
    async def rm(ctx, samples):
        return [1.0, float("nan")]

    scorer = scorer_for(monkeypatch, rm, group_rm=True)
    samples = group(2)
    await scorer.score_group(samples)
    scorer.close()
    assert all(s.status is Status.FAILED for s in samples) and scorer.errors == 2


async def test_a_nan_inside_a_dict_reward_is_a_reward_error(monkeypatch):
    async def rm(ctx, sample):
        return {"score": float("nan"), "pred": "x"}

    scorer = scorer_for(monkeypatch, rm, reward_key="score")
    samples = group(1)
    await scorer.score_group(samples)
    scorer.close()
    assert samples[0].status is Status.FAILED and scorer.errors == 1
