"""How `slime-async train` decides to restart a failed run, where children start, and how a start
ends when the prompts fail to load (its actors' configs: test_run_config_resolve.py)."""

import asyncio
from dataclasses import replace

import pytest

from actors.loop.launch import (rollout_starts_with_trainer, should_restart, start_unless_failed,
                                trainer_starts_with_engines)
from actors.loop.run_config import RunConfig
from actors.loop.train_loop import RunProgress
from slime_async.config.sections import CheckpointConfig
from slime_async.runtime import EXIT_FAILURE


def config_with(**checkpoint):
    return RunConfig(checkpoint=CheckpointConfig(**checkpoint))


def test_a_failed_run_that_trained_restarts_while_restarts_are_left():
    config = config_with(save="/ckpt", max_run_restarts=2)
    trained = RunProgress(steps_trained=3)
    assert should_restart(config, EXIT_FAILURE, trained, restarts=0)
    assert should_restart(config, EXIT_FAILURE, trained, restarts=1)
    assert not should_restart(config, EXIT_FAILURE, trained, restarts=2)


def test_no_restart_after_success_a_signal_a_failure_before_training_or_without_save():
    trained = RunProgress(steps_trained=3)
    assert not should_restart(config_with(save="/ckpt"), 0, trained, restarts=0)
    assert not should_restart(config_with(save="/ckpt"), 128 + 15, trained, restarts=0)  # SIGTERM
    assert not should_restart(config_with(save="/ckpt"), EXIT_FAILURE, RunProgress(), restarts=0)
    assert not should_restart(config_with(), EXIT_FAILURE, trained, restarts=0)


@pytest.mark.parametrize(("change", "gpu", "early"), [
    ({}, False, True),  # CPU: no device to share
    ({}, True, True),  # engines on GPUs after the trainer's
    ({"colocate": True}, True, False),  # SGLang sizes its pool from the memory free when it starts
    ({"update_weight_transport": "tensor"}, True, False),
    ({"colocate": True}, False, True),
])
def test_the_trainer_starts_beside_the_engines_unless_they_share_its_gpus(change, gpu, early):
    config = RunConfig()
    config = replace(config, train=replace(config.train, **change))
    assert trainer_starts_with_engines(config, gpu) is early


def test_engines_sharing_the_trainers_gpus_start_first():
    config = RunConfig()
    config = replace(config, engine=replace(config.engine, rollout_share_trainer_gpus=True))
    assert not trainer_starts_with_engines(config, True)


@pytest.mark.parametrize(("section", "change", "gpu", "restarts", "early"), [
    ("train", {}, False, 0, True),  # the engines serve the HF checkpoint the trainer starts from
    ("train", {}, True, 0, True),
    ("train", {}, False, 1, False),  # a restart's weights come from its checkpoint, by a sync first
    ("checkpoint", {"load": "/ckpt"}, False, 0, False),
    ("engine", {"engine_type": "external"}, False, 0, False),  # serves whatever it was given last
    ("train", {"colocate": True}, False, 0, False),  # the engines get the devices once the trainer is up
    ("engine", {"rollout_share_trainer_gpus": True}, True, 0, False),
])
def test_the_rollout_generates_during_the_trainers_start_only_from_the_weights_it_starts_from(
        section, change, gpu, restarts, early):
    config = RunConfig()
    config = replace(config, **{section: replace(getattr(config, section), **change)})
    assert rollout_starts_with_trainer(config, gpu, restarts) is early


async def test_a_start_ends_with_the_other_tasks_error_when_it_fails_first_and_the_start_is_cancelled():
    loop = asyncio.get_running_loop()
    other, cancelled = loop.create_future(), []

    async def slow_start():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    loop.call_later(0.01, other.set_exception, ValueError("prompt data p.jsonl: none of its 2 rows is usable"))
    with pytest.raises(ValueError, match="none of its 2 rows"):
        await start_unless_failed(other, slow_start())
    assert cancelled == [True]


async def test_a_start_returns_its_result_when_the_other_task_succeeds_or_is_still_running():
    loop = asyncio.get_running_loop()
    done, running = loop.create_future(), loop.create_future()
    done.set_result("data")

    async def start():
        await asyncio.sleep(0)
        return "engines"

    assert await start_unless_failed(done, start()) == "engines"
    assert await start_unless_failed(running, start()) == "engines"
    running.cancel()
