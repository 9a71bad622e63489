"""Scoring samples: a custom async reward function or a built-in one, with errors contained.

A reward function that raises or exceeds ``--reward-timeout`` never stops the run: the sample
is marked failed and either scored 0 or its whole group dropped (``--on-reward-error``), and
the error is logged and counted (``rollout/reward_errors``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from actors.rollout.hooks import hook_style, load_function
from policies.rewards import BUILTIN_REWARDS
from slime_async.sample import Sample, Status

log = logging.getLogger(__name__)


class RewardScorer:
    """``plugins`` (a SlimePlugins) lets a slime-style ``rm(args, sample)`` run; without it only
    native reward functions load."""

    def __init__(self, config: Any, ctx: Any, plugins: Any = None):
        self.config = config
        self.ctx = ctx
        self.errors = 0
        self._custom: Callable[..., Any] | None = None
        if config.custom_rm_path:
            function = load_function(config.custom_rm_path, "--custom-rm-path")
            if plugins is not None and hook_style(function) == "slime":
                function = plugins.reward(function)
            elif not inspect.iscoroutinefunction(function):
                raise ValueError(f"--custom-rm-path {config.custom_rm_path}: must be an async function")
            self._custom = function
        elif config.rm_type not in BUILTIN_REWARDS:
            raise ValueError(f"--rm-type {config.rm_type!r}: choose one of {', '.join(BUILTIN_REWARDS)} "
                             "or give --custom-rm-path")

    async def score_group(self, samples: list[Sample]) -> bool:
        """Set ``reward`` on every sample; False when the group must be dropped."""
        if self._custom is not None and self.config.group_rm:
            try:
                rewards = await asyncio.wait_for(self._custom(self.ctx, samples), self.config.reward_timeout)
                if len(rewards) != len(samples):
                    raise ValueError(f"returned {len(rewards)} rewards for {len(samples)} samples")
                for sample, reward in zip(samples, rewards):
                    sample.reward = self._scalar(reward, sample)
                return True
            except Exception as error:  # noqa: BLE001 - a user function may raise anything
                return self._failed(samples, error)
        results = await asyncio.gather(*(self._score_one(sample) for sample in samples))
        return all(results)

    async def _score_one(self, sample: Sample) -> bool:
        try:
            if self._custom is not None:
                reward = await asyncio.wait_for(self._custom(self.ctx, sample), self.config.reward_timeout)
            else:
                builtin = BUILTIN_REWARDS[self.config.rm_type]
                text = sample.response or self.ctx.tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
                reward = await asyncio.wait_for(asyncio.to_thread(builtin, text, sample.label),
                                                self.config.reward_timeout)
            sample.reward = self._scalar(reward, sample)
            return True
        except Exception as error:  # noqa: BLE001
            return self._failed([sample], error)

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
        return float(reward)

    def _failed(self, samples: list[Sample], error: BaseException) -> bool:
        self.errors += len(samples)
        reason = "timed out" if isinstance(error, asyncio.TimeoutError) else f"{type(error).__name__}: {error}"
        for sample in samples:
            log.warning("reward of sample %d/%d failed (%s)", sample.group_index, sample.index, reason)
            sample.status = Status.FAILED
            sample.metadata["reward_error"] = reason
            sample.reward = 0.0
        return self.config.on_reward_error == "zero"
