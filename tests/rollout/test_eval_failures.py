"""One failed sample does not fail an evaluation: a real CPU engine refuses one row's request (a prompt
longer than the model's context, which SGLang answers with HTTP 400 too) and the reward function raises
on another; the evaluation finishes over the rest, counts and logs each failure with its row."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.rollout.actor import RolloutActor
from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from actors.router import RouterActor, RouterConfig
from examples.models.tiny import build_tiny_model
from slime_async.actor import spawn

CONTEXT = 64  # the model's context length: a longer prompt is refused by the engine


async def rm(ctx, sample) -> float:
    if sample.label == "boom":
        raise RuntimeError("the grader is down")
    return 1.0 if sample.label == "right" else 0.0


class Rows:
    def __init__(self, rows: list[tuple[list[int], str]]):
        self.prompts = [Prompt(index=i, epoch=0, prompt=f"row {i}", prompt_ids=ids, label=label)
                        for i, (ids, label) in enumerate(rows)]

    def all_prompts(self):
        return iter(self.prompts)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("eval-failures") / "model", arch="qwen2",
                            max_position_embeddings=CONTEXT, seed=0)


@pytest.fixture(scope="module")
def engine_url(model, tmp_path_factory) -> Iterator[str]:
    process, url = start_local_engine(model, tmp_path_factory.mktemp("eval-engine") / "engine.log", "--num-threads", "1")
    yield url
    stop_local_engine(process)


async def evaluate(url: str, config: RolloutConfig, datasets, tokenizer=None) -> tuple[dict, dict]:
    """The evaluation's metrics and then the rollout's counters, through a real router."""
    router = await spawn(RouterActor(RouterConfig(router_health_interval=3600.0, router_load_interval=0.0), [url]))
    try:
        rollout = await spawn(RolloutActor(config, router=router, buffer=router, dataset=None, tokenizer=tokenizer))
        try:
            return await rollout.ask("evaluate", datasets, timeout=120), await rollout.ask("metrics")
        finally:
            await rollout.stop()
    finally:
        await router.stop()


async def test_an_engine_error_and_a_reward_error_leave_the_evaluation_to_the_other_samples(model, engine_url, caplog):
    config = RolloutConfig(custom_rm_path=f"{__name__}:rm", n_samples_per_eval_prompt=2,
                           rollout_max_response_len=4, eval_max_response_len=4)
    rows = Rows([([1, 2, 3], "right"), (list(range(1, CONTEXT + 10)), "right"), ([4, 5], "boom"), ([6, 7], "wrong")])
    metrics, counters = await evaluate(engine_url, config, {"set": rows}, AutoTokenizer.from_pretrained(model))
    # 4 rows x 2 samples: row 1's are refused by the engine, row 2's rewards raise; rows 0 and 3 finish.
    assert metrics["eval/set/failed_samples"] == 4.0 and metrics["eval/set/samples"] == 4.0
    assert metrics["eval/set/reward_mean"] == 0.5  # (1 + 1 + 0 + 0) / 4: over the finished samples only
    assert counters["rollout/generation_errors"] == 2.0 and counters["rollout/reward_errors"] == 2.0
    assert counters["rollout/eval_errors"] == 0.0
    lines = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(lines) == 4
    assert sum("eval 'set': row 1 sample" in line and "longer than the model's context length" in line
               for line in lines) == 2
    assert sum("eval 'set': row 2 sample" in line and "RuntimeError: the grader is down" in line for line in lines) == 2


async def test_an_evaluation_whose_every_sample_fails_reports_no_reward(engine_url):
    config = RolloutConfig(custom_rm_path=f"{__name__}:rm", rollout_max_response_len=4)
    metrics, counters = await evaluate(engine_url, config, Rows([([4, 5], "boom")]))
    assert metrics == {"eval/samples": 0.0, "eval/failed_samples": 1.0}  # no reward_mean of 0 that was never earned
    assert counters["rollout/eval_errors"] == 1.0  # an evaluation that measured nothing failed
