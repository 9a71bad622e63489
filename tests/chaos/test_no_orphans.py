"""Chaos: kill -9 of any process of a run leaves no descendant of it alive.

Every descendant is recorded while the run lives (psutil, every 0.2 s; tests/chaos/process_tree.py)
— engine, torchrun, the Megatron ranks, and what the ranks start when they save a checkpoint
(megatron-core's async writer keeps a multiprocessing Manager and its resource tracker) — and
each recorded PID must be gone within seconds of the kill or of the run's end. (kill -9 of the
engine: test_engine_restart.py; of a trainer rank: tests/e2e/test_resume.py.)
"""

import os
import signal

import pytest

from conftest import base_argv, is_trainer_rank

# Each case is one short run; on a busy shared machine its start-up alone can take minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def saving_argv(model, data, save, steps):
    return [*base_argv(model, data, steps=steps), "--save", str(save), "--save-interval", "1"]


def wait_for_checkpoint(run, save, step):
    run.wait_until(lambda: (save / "latest").is_file() and (save / "latest").read_text() == f"step_{step:06d}",
                   300, f"the step-{step} checkpoint")


def checkpoint_helpers(run):
    """The processes the ranks started (megatron's writer: a Manager and a resource tracker)."""
    ranks = {r.pid for r in run.tracker.recorded() if is_trainer_rank(r.cmdline)}
    helpers = []
    for record in run.tracker.recorded():
        try:
            import psutil

            if record.alive() and psutil.Process(record.pid).ppid() in ranks:
                helpers.append(record)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
    return helpers


def test_kill_9_of_the_supervisor_leaves_no_descendant(launch, chaos_model, chaos_data, tmp_path):
    save = tmp_path / "save"
    run = launch(saving_argv(chaos_model, chaos_data, save, steps=20))
    wait_for_checkpoint(run, save, 1)
    run.tracker.scan()
    recorded = run.tracker.recorded()
    assert any("actors.engine.cpu" in r.cmdline for r in recorded)
    assert any(is_trainer_rank(r.cmdline) for r in recorded)
    assert checkpoint_helpers(run), "the checkpoint writer started no helper process: nothing to test"
    run.kill9()
    # 10 s: every descendant dies by a parent-death signal or its own parent watch (1 s) at once;
    # the rank's resource tracker at the end of its pipe, whose holders (the rank, its forked and
    # spawned helpers) all arm their watch before importing torch (actors/megatron/parent_death.py).
    left = run.tracker.wait_all_gone(10)
    assert left == [], f"survived kill -9 of the supervisor: {run.tracker.describe(left)}"


# A trainer rank's kill -9 (its checkpoint helpers included, and the run's restart to the end) is
# tests/e2e/test_resume.py's run B.

