"""Run checkpoints: reconciling the rollout's and the buffer's snapshots, and when a failed run restarts."""

from actors.loop.checkpoint import latest_checkpoint, without_buffered
from actors.loop.launch import should_restart
from actors.loop.run import RunProgress
from slime_async.config.run import RunConfig
from slime_async.config.sections import CheckpointConfig
from slime_async.runtime import EXIT_FAILURE


def pending(group_index, name):
    return {"group_index": group_index, "prompt": {"prompt": name}}


def buffer_with_groups(*group_indexes):
    return {"groups": [[{"group_index": g, "index": i} for i in range(2)] for g in group_indexes]}


def test_a_group_in_both_snapshots_is_kept_only_as_buffered():
    prompts = [pending(3, "a"), pending(4, "b"), pending(None, "retry")]
    assert without_buffered(prompts, buffer_with_groups(1, 4)) == [pending(3, "a"), pending(None, "retry")]


def test_prompts_waiting_for_a_retry_are_always_kept():
    prompts = [pending(None, "x"), pending(None, "y")]
    assert without_buffered(prompts, buffer_with_groups()) == prompts


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


def test_latest_checkpoint_is_the_step_directory_latest_names(tmp_path):
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(None) is None
    (tmp_path / "step_000004").mkdir()
    (tmp_path / "latest").write_text("step_000004")
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000004"
