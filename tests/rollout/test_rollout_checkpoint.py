"""The rollout's checkpoint holds every prompt its data cursor has passed.

A real RolloutActor and BufferActor; the router is a stand-in whose generations never end, so
the producer fills every group slot and then waits for another (it reserves a buffer slot only
once it has a group slot) — the moment a checkpoint must not lose a prompt.
"""

from __future__ import annotations

import asyncio

from actors.buffer import BufferActor, BufferConfig
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from slime_async.actor import Actor, spawn


class NeverAnsweringRouter(Actor):
    name = "router"

    def generate(self, input_ids, sampling_params, session_id=None, trace_args=None):
        return self.defer(asyncio.Event().wait())


class ListDataset:
    def __init__(self, n: int):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=[1, 2, 3]) for i in range(n)]
        self.position = 0

    def next_prompt(self) -> Prompt | None:
        if self.position == len(self.prompts):
            return None
        self.position += 1
        return self.prompts[self.position - 1]

    def state_dict(self) -> dict:
        return {"position": self.position}


async def test_a_prompt_never_leaves_the_cursor_without_being_in_flight():
    dataset = ListDataset(8)
    router = await spawn(NeverAnsweringRouter())
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=8), groups_per_step=1))
    # Two samples per prompt and four generations at a time: two group slots.
    config = RolloutConfig(prompt_data="unused.jsonl", rollout_batch_size=1, n_samples_per_prompt=2,
                           rollout_concurrency=4)
    rollout = await spawn(RolloutActor(config, router=router, buffer=buffer, dataset=dataset, tokenizer=None))
    try:
        rollout.tell("start")
        for _ in range(50):  # until both slots are taken and the producer waits for a third
            await asyncio.sleep(0.02)
        state = await rollout.ask("state_dict")
        pending = [p["prompt"]["prompt"] for p in state["pending_prompts"]]
        assert pending == ["p0", "p1"]
        assert state["dataset"] == {"position": 2}  # nothing taken beyond what is in flight
    finally:
        for ref in (rollout, buffer, router):
            await ref.stop()
