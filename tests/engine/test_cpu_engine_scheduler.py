"""The CPU engine scheduler in-process (no HTTP): admission under the token budget."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.engine.cpu.model_runner import ModelRunner
from actors.engine.cpu.protocol import SamplingParams
from actors.engine.cpu.scheduler import Request, Scheduler, SchedulerConfig, ThroughputWindow


@pytest.fixture
def scheduler(tiny_model_dir: Path) -> Iterator[Scheduler]:
    # Each request below reserves 3 + 60 tokens, so two do not fit in 100 at once.
    sched = Scheduler(ModelRunner(tiny_model_dir), SchedulerConfig(max_running_requests=8, max_total_tokens=100))
    sched.start()
    yield sched
    sched.stop()


def submit(scheduler: Scheduler, rid: str, max_new_tokens: int) -> concurrent.futures.Future:
    done: concurrent.futures.Future = concurrent.futures.Future()
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True)
    scheduler.submit(Request(rid, [5, 6, 7], params, True, done.set_result))
    return done


def test_request_beyond_the_token_budget_waits_until_tokens_free_up(scheduler):
    scheduler.call(lambda: scheduler.pause("in_place")).result()
    first, second = submit(scheduler, "first", 60), submit(scheduler, "second", 60)
    scheduler.call(scheduler.resume).result()
    assert first.result(timeout=60).finish_reason == {"type": "length", "length": 60}
    assert second.result(timeout=60).finish_reason == {"type": "length", "length": 60}
    assert scheduler.stats.max_running_batch == 1


def test_requests_within_the_token_budget_run_together(scheduler):
    scheduler.call(lambda: scheduler.pause("in_place")).result()
    futures = [submit(scheduler, f"r{i}", 20) for i in range(3)]  # 3 x 23 tokens fit in 100
    scheduler.call(scheduler.resume).result()
    assert all(f.result(timeout=60).finish_reason["type"] == "length" for f in futures)
    assert scheduler.stats.max_running_batch == 3


def test_stopping_the_scheduler_aborts_what_is_left(tiny_model_dir):
    sched = Scheduler(ModelRunner(tiny_model_dir), SchedulerConfig())
    sched.start()
    sched.call(lambda: sched.pause("in_place")).result()
    pending = submit(sched, "left-behind", 10)
    sched.stop()
    assert pending.result(timeout=10).finish_reason["type"] == "abort"


def test_gen_throughput_counts_the_decode_steps_inside_the_window():
    window = ThroughputWindow(window_s=10.0)
    assert window.rate(now=0.0) == 0.0
    window.add(started=0.0, ended=1.0, tokens=4)
    window.add(started=1.0, ended=2.0, tokens=4)
    assert window.rate(now=2.0) == 4.0  # 8 tokens since t=0
    assert window.rate(now=12.0) == 4 / 11  # the first step ended before t=2: only the second counts
    assert window.rate(now=12.5) == 0.0  # idle for longer than the window


def test_loads_report_the_recent_decode_throughput(scheduler):
    assert scheduler.call(scheduler.loads).result()["gen_throughput"] == 0.0
    submit(scheduler, "r", 20).result(timeout=60)
    assert scheduler.call(scheduler.loads).result()["gen_throughput"] > 0.0
