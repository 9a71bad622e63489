"""Chaos: the only engine dies mid-run, and the run goes on with the current policy.

Owned: kill -9 of the run's CPU engine without --save; its supervisor restarts it and the run
loads the last exported weights into it before the router sends it work, so every step trains.
External: the test's own engine is killed and restarted on its port; the run notices the
restart (a healthy engine that reports another weight version) and does the same.
"""

import json
import os
import signal
from pathlib import Path

import pytest

from conftest import base_argv

# Each case is one short run; on a busy shared machine its start-up alone can take minutes.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6


def trained_samples(dump: Path, steps: range) -> list[dict]:
    return [s for step in steps for line in (dump / f"step_{step:06d}.jsonl").read_text().splitlines()
            for s in json.loads(line)]


def assert_every_step_trained_and_synced(run) -> list[dict]:
    steps = run.train_steps()
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert [m["train/version"] for m in steps] == [float(s) for s in range(1, STEPS + 1)]
    return steps


@pytest.mark.parametrize("transport", ["disk", "distributed"])
def test_kill_9_of_the_only_owned_engine_mid_run_completes_every_step(launch, chaos_model, chaos_data, tmp_path,
                                                                      transport):
    run = launch([*base_argv(chaos_model, chaos_data, steps=STEPS), "--save-debug-rollout-data", str(tmp_path / "dump"),
                  "--update-weight-transport", transport])
    killed_after = run.wait_for_step(2)["step"]
    engines = run.pids_of("actors.engine.cpu")
    assert len(engines) == 1
    os.kill(engines[0], signal.SIGKILL)
    assert run.wait() == 0, run.log()[-4000:]
    steps = assert_every_step_trained_and_synced(run)
    assert steps[-1]["router/engine_rejoins"] == 1
    assert "loaded the current weights" in run.log()
    # The restarted engine generated only on the weights it was given (never on the HF
    # checkpoint, version 0): the last steps' samples were all generated after the kill.
    late = trained_samples(tmp_path / "dump", range(STEPS - 1, STEPS + 1))
    assert late and all(min(s["token_versions"]) > killed_after for s in late)
    assert len(run.tracker.matching("actors.engine.cpu")) == 2  # the first engine and its restart
    assert run.tracker.wait_all_gone(10) == []  # nothing the run started outlives it, the killed engine included


def test_an_external_engine_restarted_on_its_port_gets_the_current_weights(launch, cpu_engine, chaos_model,
                                                                           chaos_data, tmp_path):
    engine = cpu_engine(chaos_model)
    run = launch([*base_argv(chaos_model, chaos_data, steps=STEPS), "--engine-type", "external",
                  "--rollout-external-engine-addrs", engine.url, "--save-debug-rollout-data", str(tmp_path / "dump")])
    killed_after = run.wait_for_step(2)["step"]
    engine.kill9()
    engine.start()  # the same port: to the run, the same engine with other weights
    assert run.wait() == 0, run.log()[-4000:]
    steps = assert_every_step_trained_and_synced(run)
    assert steps[-1]["router/engine_rejoins"] == 1
    late = trained_samples(tmp_path / "dump", range(STEPS - 1, STEPS + 1))
    assert late and all(min(s["token_versions"]) > killed_after for s in late)
    # The requests the dead engine dropped were re-sent once it was back: no group was lost.
    last = steps[-1]
    assert last["router/engine_down_events"] >= 1 and last["router/retries"] >= 1
    assert last["rollout/groups_failed"] == 0
    assert run.tracker.wait_all_gone(10) == []
