"""Scoring samples: a custom reward function or a built-in one, with errors contained.

Rewards run off the supervisor's event loop (``reward_runner``): a custom one, sync or async,
on a dedicated reward thread, a built-in in a worker thread. A reward that raises, exceeds
``--reward-timeout`` or returns a non-finite value (NaN, inf) never stops the run: the sample
is marked failed and either scored 0 or its whole group dropped (``--on-reward-error``), and
the error is logged and counted (``rollout/reward_errors``; timeouts also in
``rollout/reward_timeouts``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

from actors.rollout.hooks import hook_style, load_function
from actors.rollout.config import REASONING_GYM
from actors.rollout.reasoning_gym import ReasoningGymReward
from actors.rollout.reward_runner import RewardRunner
from policies.rewards import BUILTIN_REWARDS
from slime_async.exception_text import describe
from slime_async.sample import Sample, Status
from slime_async.trace import TraceRecorder
from slime_async.task_group import gather_or_cancel

log = logging.getLogger(__name__)


class RewardScorer:
    """``plugins`` (a SlimePlugins) lets a slime-style ``rm(args, sample)`` run; without it only
    native reward functions load."""

    def __init__(self, config: Any, ctx: Any, plugins: Any = None):
        self.config = config
        self.ctx = ctx
        self.errors = 0
        self.timeouts = 0
        self.runner = RewardRunner()
        # --trace-dir: each reward call is a span (rewards of a group run at once: a lane pool).
        self._trace = getattr(ctx, "trace", None) or TraceRecorder.off()
        self._lanes = self._trace.pool("reward", "call")
        self._custom: Callable[..., Any] | None = None
        self._reasoning_gym: ReasoningGymReward | None = None
        if config.custom_rm_path:
            function = load_function(config.custom_rm_path, "--custom-rm-path")
            if plugins is not None and hook_style(function) == "slime":
                function = plugins.reward(function)
            self._custom = function
        elif config.rm_type == REASONING_GYM:
            self._reasoning_gym = ReasoningGymReward()
        elif config.rm_type not in BUILTIN_REWARDS:
            raise ValueError(f"--rm-type {config.rm_type!r}: choose one of {', '.join(BUILTIN_REWARDS)} "
                             "or give --custom-rm-path")

    async def score_group(self, samples: list[Sample]) -> bool:
        """Set ``reward`` on every sample; False when the group must be dropped."""
        if self._custom is not None and self.config.group_rm:
            try:
                with self._trace.span("reward (group)", self._lanes, cat="reward", group=samples[0].group_index):
                    rewards = await self.runner.call(self._custom, self.ctx, samples, timeout=self.config.reward_timeout)
                if len(rewards) != len(samples):
                    raise ValueError(f"returned {len(rewards)} rewards for {len(samples)} samples")
                for sample, reward in zip(samples, rewards):
                    sample.reward = self._scalar(reward, sample)
                return True
            except Exception as error:  # noqa: BLE001 - a user function may raise anything
                return self._failed(samples, error)
        results = await gather_or_cancel(*(self._score_one(sample) for sample in samples))
        return all(results)

    async def _score_one(self, sample: Sample) -> bool:
        try:
            with self._trace.span("reward", self._lanes, cat="reward", group=sample.group_index, sample=sample.index):
                reward = await self._call_reward(sample)
            sample.reward = self._scalar(reward, sample)
            return True
        except Exception as error:  # noqa: BLE001
            return self._failed([sample], error)

    async def _call_reward(self, sample: Sample) -> Any:
        if self._custom is not None:
            return await self.runner.call(self._custom, self.ctx, sample, timeout=self.config.reward_timeout)
        text = sample.response or self.ctx.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
        if self._reasoning_gym is not None:
            score = await self.runner.call(self._reasoning_gym.score, text, sample.metadata,
                                           timeout=self.config.reward_timeout)
            # Beside a partial-credit score, the exact-match rate (rollout/ and eval/exact_match).
            exact = float(self._reasoning_gym.exact_match(text, sample.metadata))
            sample.metadata["metrics"] = {**(sample.metadata.get("metrics") or {}), "exact_match": exact}
            return score
        builtin = BUILTIN_REWARDS[self.config.rm_type]
        return await self.runner.call(builtin, text, sample.label, timeout=self.config.reward_timeout)

    def _scalar(self, reward: Any, sample: Sample) -> float:
        """The float to train on; a dict reward (slime's style) is read at --reward-key and kept whole
        in ``metadata["reward_info"]``."""
        if isinstance(reward, dict):
            key = self.config.reward_key
            if key is None or key not in reward:
                raise ValueError(f"the reward function returned a dict with keys {sorted(reward)}; "
                                 + ("set --reward-key to the one to train on" if key is None
                                    else f"--reward-key {key!r} is not among them"))
            sample.metadata["reward_info"] = reward
            reward = reward[key]
        value = float(reward)
        if not math.isfinite(value):
            # One NaN turns its whole group's advantages, the loss and then the weights into NaN.
            raise ValueError(f"the reward is {value}, not a finite number")
        return value

    def close(self) -> None:
        self.runner.close()

    def _failed(self, samples: list[Sample], error: BaseException) -> bool:
        self.errors += len(samples)
        timed_out = isinstance(error, asyncio.TimeoutError)
        self.timeouts += len(samples) if timed_out else 0
        reason = (f"timed out after --reward-timeout {self.config.reward_timeout:g} s" if timed_out
                  else describe(error))
        for sample in samples:
            log.warning("reward of sample %d/%d failed (%s)", sample.group_index, sample.index, reason)
            sample.status = Status.FAILED
            sample.metadata["reward_error"] = reason
            sample.reward = 0.0
        return self.config.on_reward_error == "zero"
