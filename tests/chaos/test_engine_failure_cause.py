"""An owned CPU engine that dies shows its own exception last: at start (the run's console) and
mid-run (killed, it fails on restart: the supervisor's log line of the failed restart and the
run's last lines). The weights file is corrupt, which the model-dir preflight cannot see (it checks
that a weights file is there): the engine raises while loading it."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

import pytest

from conftest import base_argv
from actors.engine.config import EngineConfig
from actors.engine.fleet import build_fleet
from slime_async.actor import spawn
from slime_async.runtime import run_supervised
from slime_async.supervisor import ChildSpec, Supervisor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ERROR = "safetensors_rust.SafetensorError: Error while deserializing header"


def corrupt_weights(model: Path) -> None:
    for weights in model.glob("*.safetensors"):
        weights.write_bytes(b"\xff" * 64)


def assert_ends_with_the_engines_exception(lines: list[str]) -> None:
    """The last lines: the summary line, then the engine's exception, its loader frame in the
    project's code (the innermost own frame) and the library's error line last."""
    assert ERROR in lines[-1], lines[-30:]
    section = max(i for i, line in enumerate(lines) if line == "engine-0's exception:")
    assert lines[section - 1].startswith("error: ") and "engine-0" in lines[section - 1], lines[-30:]
    assert lines[section + 1] == "Traceback (most recent call last):"
    assert any(line.startswith('  File "') and "actors/engine/cpu/model_runner.py" in line
               for line in lines[section:]), lines[section:]


def test_an_engine_that_fails_at_start_ends_the_run_with_its_exception(launch, chaos_model, chaos_data, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(chaos_model, model)
    corrupt_weights(model)
    run = launch([*base_argv(model, chaos_data), "--debug-rollout-only"])
    assert run.wait() == 1, run.log()[-4000:]
    assert_ends_with_the_engines_exception(run.log().strip().splitlines())


async def test_an_engine_killed_mid_run_that_fails_on_restart_logs_and_ends_with_its_exception(
        chaos_model, tmp_path, caplog, capsys):
    model = tmp_path / "model"
    shutil.copytree(chaos_model, model)
    fleet = await build_fleet(EngineConfig(engine_type="cpu"), str(model), tmp_path / "logs", gpu_available=False)
    # The run's engines supervisor, allowed one restart: the restart fails, and it gives up.
    engines = Supervisor("engines", fleet.children, max_restarts=1, max_seconds=600)
    root = Supervisor("slime-async", [ChildSpec("engines", lambda: spawn(engines))], max_restarts=0, max_seconds=1)

    async def kill_the_engine_with_broken_weights(_root: Supervisor) -> int:
        corrupt_weights(model)
        os.kill(engines.child("engine-0").actor.pid, signal.SIGKILL)
        await asyncio.Event().wait()  # until the tree fails
        return 0

    with caplog.at_level(logging.ERROR, logger="slime_async.supervisor"):
        assert await run_supervised(root, kill_the_engine_with_broken_weights) == 1
    # The failed restart, as the run's log reports it, ends with the engine's exception...
    restart = next(r.getMessage() for r in caplog.records if "restarting engine-0 failed" in r.getMessage())
    assert ERROR in restart.splitlines()[-1], restart
    # ...and so does the console after the supervisor gave up.
    assert_ends_with_the_engines_exception(capsys.readouterr().err.strip().splitlines())
