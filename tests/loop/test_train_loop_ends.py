"""The loop's end and its evaluations: the data's end travels rollout -> buffer -> the loop's
waiting ``get`` (no polling), a prompt retried after the data ran out is still trained, and a
failed evaluation is logged and counted while training goes on.

Real RolloutActor, BufferActor, MonitorActor and train_loop (no trainer: as --debug-rollout-only
runs); the router is a stand-in that answers at once, so each test takes well under a second.
"""

from __future__ import annotations

import asyncio
import json
import logging

from actors.buffer import BufferActor, BufferConfig
from actors.loop.config import TrainConfig
from actors.loop.run_config import RunConfig
from actors.loop.train_loop import Handles, train_loop
from actors.monitor import MonitorActor, MonitorConfig
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from slime_async.actor import Actor, spawn
from examples.models.tiny import train_tokenizer

TOKENIZER = train_tokenizer(512, 0)


class StandInRouter(Actor):
    """Answers each request with two tokens at once, except: eval requests fail when
    ``fail_evals``; the first request of session ``hold`` waits for ``release`` and then fails."""

    name = "router"

    def __init__(self, *, fail_evals: bool = False, hold: str | None = None):
        super().__init__()
        self.fail_evals, self.hold = fail_evals, hold
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    def generate(self, input_ids, sampling_params, session_id=None, trace_args=None):
        if self.fail_evals and session_id.startswith("eval-"):
            raise RuntimeError("engine http://127.0.0.1:1 answered 503")
        if session_id == self.hold and not self.held.is_set():
            self.held.set()
            return self.defer(self._fail_when_released())
        return {"meta_info": {"output_token_logprobs": [[-1.0, 10, None], [-1.0, 11, None]],
                              "finish_reason": {"type": "length"}, "weight_version": "0"}}

    async def _fail_when_released(self):
        await self.release.wait()
        raise RuntimeError("engine connection reset")

    def end_session(self, session_id):
        pass

    def metrics(self):
        return {}


class Prompts:
    """n prompts, read once (a cursor), and all of them for evaluation."""

    def __init__(self, n: int):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"p{i}", prompt_ids=[1, 2], label="x") for i in range(n)]
        self.position = 0

    def next_prompt(self):
        self.position += 1
        return self.prompts[self.position - 1] if self.position <= len(self.prompts) else None

    def all_prompts(self):
        return iter(self.prompts)


async def run_loop(tmp_path, router: StandInRouter, *, prompts: int, batch: int, total_steps: int,
                   eval_interval: int | None = None, while_running=None):
    """train_loop over real actors; returns (loop result, handles, rollout metrics after the loop, metrics.jsonl)."""
    rollout_config = RolloutConfig(rm_type="exact", rollout_batch_size=batch, n_samples_per_prompt=2,
                                   rollout_max_response_len=2, eval_max_response_len=2, eval_interval=eval_interval)
    config = RunConfig(rollout=rollout_config, train=TrainConfig(debug_rollout_only=True))
    router_ref = await spawn(router)
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=8), groups_per_step=batch))
    rollout = await spawn(RolloutActor(rollout_config, router=router_ref, buffer=buffer, dataset=Prompts(prompts),
                                       tokenizer=TOKENIZER))
    monitor = await spawn(MonitorActor(MonitorConfig(tensorboard=False, progress_bar=False, log_interval=0), tmp_path))
    h = Handles(rollout=rollout, buffer=buffer, trainer=None, router=router_ref, monitor=monitor, weight_sync=None,
                checkpointer=None, eval_dataset=Prompts(1) if eval_interval else None, total_steps=total_steps)
    try:
        loop = asyncio.ensure_future(train_loop(config, h))
        if while_running is not None:
            await while_running()
        async with asyncio.timeout(30):  # a hang guard only: the run takes milliseconds
            code = await loop
        rollout_metrics = await rollout.ask("metrics")
    finally:
        for ref in (rollout, buffer, monitor, router_ref):
            await ref.stop()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return code, h, rollout_metrics, rows


async def test_the_loop_ends_when_the_rollout_signals_the_end_of_the_data(tmp_path, caplog):
    # 4 prompts, 2 per step, 3 steps asked: the data ends after step 2, during step 3's get.
    code, h, _, rows = await run_loop(tmp_path, StandInRouter(), prompts=4, batch=2, total_steps=3)
    assert code == 0 and h.progress.steps_trained == 2
    assert [row["step"] for row in rows] == [1, 2]
    assert "prompt data ran out after 2 of 3 steps" in caplog.text


async def test_a_prompt_that_fails_after_the_data_ran_out_is_retried_and_trained(tmp_path):
    # The last prompt's group fails only once the cursor is exhausted and the producer waits for
    # the groups in flight; ending there (3 groups) would leave step 2 untrained.
    router = StandInRouter(hold="group-3")

    async def fail_the_held_group_late():
        await router.held.wait()
        for _ in range(50):  # the producer takes its next reservation, finds no prompt and waits
            await asyncio.sleep(0)
        router.release.set()

    code, h, metrics, _ = await run_loop(tmp_path, router, prompts=4, batch=2, total_steps=3,
                                         while_running=fail_the_held_group_late)
    assert code == 0 and h.progress.steps_trained == 2
    assert metrics["rollout/generation_errors"] == 1.0


async def test_a_failed_evaluation_is_logged_and_counted_and_training_goes_on(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="actors.loop.train_loop")
    code, h, metrics, rows = await run_loop(tmp_path, StandInRouter(fail_evals=True), prompts=2, batch=1,
                                            total_steps=2, eval_interval=1)
    assert code == 0 and h.progress.steps_trained == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # Evaluations at 0, 1 and 2; the last one was still running when the steps ended and was awaited.
    # Each one's only sample failed: logged with its row, and the evaluation failed for want of any.
    rows_failed = [e for e in errors if e.startswith("eval: row 0 sample 0 failed, left out: RuntimeError: "
                                                     "engine http://127.0.0.1:1 answered 503")]
    assert len(rows_failed) == 3, errors
    assert errors.count("eval failed: every one of its 1 samples failed (see above); no reward to report") == 3
    assert metrics["rollout/eval_errors"] == 3.0
    assert [row["eval/failed_samples"] for row in rows if "eval/failed_samples" in row] == [1.0] * 3
    assert not any("eval/reward_mean" in row for row in rows)
