"""--global-batch-size / --num-steps-per-rollout: resolved and checked at start, one line naming the flags."""


import pytest

from actors.loop.cli import COMMANDS

from slime_async.config.flags import ConfigError
from actors.loop.run_config import parse_run_config

# 4 prompts × 4 samples = 16 samples per rollout
REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/", "--rollout-batch-size", "4",
            "--n-samples-per-prompt", "4"]


def test_num_steps_per_rollout_sets_the_global_batch_size_as_in_slime():
    config = parse_run_config([*REQUIRED, "--num-steps-per-rollout", "4"])
    assert config.trainer.global_batch_size == 4


def test_a_global_batch_size_that_agrees_with_num_steps_per_rollout_is_accepted():
    assert parse_run_config([*REQUIRED, "--num-steps-per-rollout", "2", "--global-batch-size", "8"]
                            ).trainer.global_batch_size == 8


@pytest.mark.parametrize(("flags", "message"), [
    (["--num-steps-per-rollout", "3"], r"\(16\) must be a multiple of --num-steps-per-rollout \(3\)"),
    (["--num-steps-per-rollout", "2", "--global-batch-size", "4"], r"--global-batch-size \(4\) disagrees"),
    (["--global-batch-size", "6"], r"\(16\) must be a multiple of --global-batch-size \(6\)"),
    (["--global-batch-size", "4", "--micro-batch-size", "3"],
     r"--global-batch-size \(4\) must be a multiple of --micro-batch-size \(3\) × data-parallel ranks \(1\)"),
    (["--global-batch-size", "4", "--micro-batch-size", "2", "--actor-num-procs", "4"],
     r"--global-batch-size \(4\) must be a multiple of --micro-batch-size \(2\) × data-parallel ranks \(4\)"),
    (["--global-batch-size", "2", "--actor-num-procs", "4"], r"at least the data-parallel ranks \(4\)"),
])
def test_a_rollout_or_global_batch_that_does_not_split_evenly_fails_at_start(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config([*REQUIRED, *flags])


def test_data_parallel_ranks_discount_tensor_parallelism():
    # 4 ranks at TP 2 are 2 DP ranks: 4 % (2 × 2) == 0
    config = parse_run_config([*REQUIRED, "--global-batch-size", "4", "--micro-batch-size", "2",
                               "--actor-num-procs", "4", "--tensor-model-parallel-size", "2"])
    assert config.trainer.global_batch_size == 4


def test_the_cli_prints_one_line_without_a_traceback(capsys):
    # The CLI's train command in this process (a process of its own cost ~5 s of imports).
    assert COMMANDS["train"][0]([*REQUIRED, "--global-batch-size", "6"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "must be a multiple of --global-batch-size (6)" in err
