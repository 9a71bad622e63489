"""The rollout hands each group's admission version back to the buffer with its put, so that a
training step waits for a straggler at its deadline (--straggler-policy wait).

A real RolloutActor and BufferActor (k = 1, one group a step); the router is a stand-in that
answers at once, except for group 0, whose answer waits until the test releases it.
"""

from __future__ import annotations

import asyncio

from actors.buffer import BufferActor, BufferConfig
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from slime_async.actor import Actor, spawn


class HoldingRouter(Actor):
    """Answers two tokens of the current policy version; group 0's answer waits for ``release``."""

    name = "router"

    def __init__(self):
        super().__init__()
        self.version = 0
        self.released = asyncio.Event()

    def generate(self, input_ids, sampling_params, session_id=None, trace_args=None):
        version = self.version  # the version that generates the tokens: the one at the request

        async def answer():
            if session_id == "group-0":
                await self.released.wait()
            return {"meta_info": {"output_token_logprobs": [[-1.0, 7, None], [-1.0, 8, None]],
                                  "finish_reason": {"type": "length"}, "weight_version": str(version)}}

        return self.defer(answer())

    def set_version(self, version: int) -> None:
        self.version = version

    def release(self) -> None:
        self.released.set()

    def end_session(self, session_id: str) -> None:
        pass


class Prompts:
    def __init__(self, n: int):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=[1, 2], label="x") for i in range(n)]

    def next_prompt(self) -> Prompt | None:
        return self.prompts.pop(0) if self.prompts else None


async def settle(rounds: int = 200) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_a_step_waits_for_the_straggler_the_rollout_started_first():
    router = await spawn(HoldingRouter())
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=8, max_staleness=1), groups_per_step=1))
    config = RolloutConfig(prompt_data="unused.jsonl", rollout_batch_size=1, n_samples_per_prompt=1,
                           rollout_max_response_len=2, rm_type="exact")
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=Prompts(8), tokenizer=None))
    try:
        rollout.tell("start")
        # Version 0 admits (0 + 1 + 1) x 1 = 2 groups, both due at version 1: group 0 (held) and group 1.
        [first] = await buffer.ask("get", 1, 0, timeout=5)
        assert first[0].group_index == 1
        await router.ask("set_version", 1)
        await buffer.ask("set_version", 1)  # admits group 2 (due at 2), which finishes at once
        step = asyncio.ensure_future(buffer.ask("get", 1, 1, timeout=5))
        await settle()
        # Group 2 is buffered, but version 1 is group 0's last chance: the step waits for it.
        assert not step.done()
        metrics = await buffer.ask("metrics")
        assert (metrics["buffer/size"], metrics["buffer/reserved"], metrics["buffer/straggler_holds"]) == (1, 1, 1)
        await router.ask("release")
        [second] = await step
        assert second[0].group_index == 0 and second[0].token_versions == [0, 0]
        assert (await buffer.ask("metrics"))["buffer/dropped_stale"] == 0
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()
