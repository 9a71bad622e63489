"""A hook that fails after opening a trajectory session leaves no recording in the router's front; a
broken router capacity handler fails the rollout, a missing one leaves its limit."""

from __future__ import annotations

import asyncio

import pytest

from actors.buffer import BufferActor, BufferConfig
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from slime_async.actor import Actor, ActorFailed, spawn


async def agent_that_fails_midway(ctx, sample, sampling_params):
    ctx.trajectory_session(sample)  # as ctx.openai_base_url(sample) does before the agent's turns
    raise RuntimeError("the agent crashed after its first turn")


class SessionRecordingRouter(Actor):
    name = "router"

    def __init__(self):
        super().__init__()
        self.ended: list[str] = []

    def end_session(self, session_id: str) -> None:
        self.ended.append(session_id)

    def sessions_ended(self) -> list[str]:
        return self.ended


class OnePrompt:
    def __init__(self):
        self.prompts = [Prompt(index=0, epoch=0, prompt="p0", prompt_ids=[1, 2, 3])]

    def next_prompt(self) -> Prompt | None:
        return self.prompts.pop() if self.prompts else None


async def test_the_sessions_a_failed_group_opened_are_ended():
    router = await spawn(SessionRecordingRouter())
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=1))
    config = RolloutConfig(prompt_data="unused.jsonl", rollout_batch_size=1, n_samples_per_prompt=2,
                           custom_generate_function_path=f"{__name__}:agent_that_fails_midway")
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=OnePrompt(), tokenizer=None))
    try:
        rollout.tell("start")
        for _ in range(100):  # the group fails and is retried until it is dropped
            await asyncio.sleep(0.02)
            if len(await router.ask("sessions_ended")) >= 2:
                break
        ended = await router.ask("sessions_ended")
        assert len(ended) >= 2 and len(set(ended)) == len(ended)  # both samples' sessions, each attempt's own
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()


class BrokenCapacityRouter(Actor):
    name = "router"

    def engine_capacities(self, wait_for_first_read: bool = False) -> list:
        raise AttributeError("a bug inside the router's handler")


class NoCapacityRouter(Actor):
    name = "router"


async def test_an_attribute_error_inside_the_routers_capacity_handler_fails_the_rollout_instead_of_being_ignored():
    router = await spawn(BrokenCapacityRouter())
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=1))
    config = RolloutConfig(prompt_data="unused.jsonl", rollout_batch_size=1, n_samples_per_prompt=2)
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=OnePrompt(), tokenizer=None))
    try:
        rollout.tell("start")
        with pytest.raises(ActorFailed, match="a bug inside the router's handler"):
            async with asyncio.timeout(10):
                await rollout.wait()
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()


async def test_a_router_without_the_capacity_handler_leaves_the_initial_limit():
    router = await spawn(NoCapacityRouter())
    rollout = RolloutActor(RolloutConfig(rollout_concurrency=12), router=router, buffer=None, dataset=None,
                           tokenizer=None)
    try:
        assert not rollout._capacity_known and rollout._slots.limit == 12
    finally:
        await router.stop()
