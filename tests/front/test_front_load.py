"""The front under a small agent load: the benchmark's own driver (benchmarks/front_load.py) with
the stock ``openai`` client, 50 concurrent streamed tool-calling sessions of 3 turns against an
engine that answers at once, through a front that works on 8 requests at once
(--router-front-concurrency). Every turn answered, every session recorded token for token; the
event loop's lag is measured and printed (no timing is asserted: the machine decides that)."""

import json
import os

import pytest_asyncio

from benchmarks.front_load import main, run_load
from benchmarks.instant_engine import InstantEngine
from slime_async.trajectory import prompt_ids

SESSIONS, TURNS = 50, 3


@pytest_asyncio.fixture
async def instant_engine(text_model):
    engine = InstantEngine(text_model.tokenizer)
    await engine.start()
    yield engine
    await engine.stop()


async def test_fifty_agent_sessions_are_answered_and_recorded_token_exactly(instant_engine, start_front, text_model):
    # a gate narrower than the load: requests queue for the front's slots and all still finish
    ref, url = await start_front([instant_engine.url], text_model, router_front_concurrency=8)
    result = await run_load(url, SESSIONS, TURNS, max_tokens=128, stop=["Observation:"], client="openai")
    assert dict(result.errors) == {} and result.requests == SESSIONS * TURNS
    for session_id, turns in result.turns.items():
        recorded = await ref.ask("take_trajectory", session_id)
        assert len(recorded) == TURNS
        for index, (seen, kept) in enumerate(zip(turns, recorded)):
            assert prompt_ids(recorded, index) == seen.prompt_ids
            assert [c.output_ids for c in kept.choices] == [seen.output_ids]
        # the agent loop really ran: a tool call, the answer after its result, then a new question's call
        assert [t.finish for t in turns] == ["tool_calls", "stop", "tool_calls"]
        assert turns[1].output_ids == instant_engine.answer
    metrics = await ref.ask("metrics")
    print(f"\n{SESSIONS} sessions x {TURNS} turns: {result.requests / result.wall:.1f} requests/s; "
          f"router loop lag p50 {metrics['router/loop_lag_p50_ms']} ms, p99 {metrics['router/loop_lag_p99_ms']} ms, "
          f"max {metrics['router/loop_lag_max_ms']:.1f} ms; front added p99 {metrics['router/front_added_p99_ms']} ms")


def test_the_benchmark_against_an_engine_already_running_writes_its_row_with_the_load(cpu_engine, chat_model_dir,
                                                                                      tmp_path):
    # the GPU driver's path (benchmarks/gpu/front_load.sh): --engine-url, the router pinned to one CPU, --json
    cpu = str(min(os.sched_getaffinity(0)))
    row_path = tmp_path / "row.json"
    code = main(["--engine-url", cpu_engine, "--model-path", str(chat_model_dir), "--sessions", "4", "--turns", "2",
                 "--max-tokens", "8", "--client", "aiohttp", "--router-cpus", cpu, "--json", str(row_path)])
    row = json.loads(row_path.read_text())
    assert code == 0 and row["errors"] == 0 and row["requests"] == 8
    assert (row["engine"], row["client"], row["turns"], row["max_tokens"], row["router_cpus"]) == (
        cpu_engine, "aiohttp", 2, 8, cpu)
    assert 0 < row["output_tokens"] <= 8 * 8
