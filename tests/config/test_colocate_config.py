"""--colocate: settings that cannot time-share the devices fail at start, one line naming the flags."""

from dataclasses import replace

import pytest

from actors.megatron.config import TrainerConfig

from actors.loop.cli import COMMANDS
from actors.loop.run_config import parse_run_config
from slime_async.config.flags import ConfigError

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--colocate"]
SGLANG = ["--engine-type", "sglang", "--sglang-enable-memory-saver"]


@pytest.mark.parametrize("mode", ["sync", "one-step-off"])
def test_colocate_moves_weights_by_tensor_handles(mode):
    config = parse_run_config([*REQUIRED, "--engine-type", "cpu", "--train-mode", mode])
    assert config.train.colocate and config.train.update_weight_transport == "tensor"
    assert parse_run_config([*SGLANG, *REQUIRED, "--actor-num-gpus-per-node", "2",
                             "--rollout-num-gpus", "2", "--rollout-num-gpus-per-engine", "2"]).train.colocate


@pytest.mark.parametrize(("flags", "message"), [
    (["--train-mode", "fully-async"], r"--colocate with --train-mode fully-async: .* use sync or one-step-off"),
    (["--update-weight-transport", "distributed"], r"--colocate with --update-weight-transport distributed: .*"
                                                   r"an NCCL group cannot span one GPU twice"),
    (["--update-weight-transport", "delta"], r"--colocate with --update-weight-transport delta"),
    (["--update-weights-interval", "2"], r"--colocate with --update-weights-interval 2"),
    (["--engine-type", "external", "--rollout-external-engine-addrs", "http://h:1"],
     r"--colocate with --engine-type external"),
    (["--advantage-estimator", "ppo"], r"--colocate with --advantage-estimator ppo"),
    # An explicit disk is refused, not silently replaced by tensor.
    (["--update-weight-transport", "disk"], r"--colocate with --update-weight-transport disk"),
    (["--weight-update-mode", "in_place"], r"--colocate with --weight-update-mode in_place: .* use abort"),
    (["--weight-update-mode", "drain"], r"--colocate with --weight-update-mode drain"),
    (["--weight-update-mode", "retract"], r"--colocate with --weight-update-mode retract"),
    (["--engine-type", "sglang"], r"needs --sglang-enable-memory-saver"),
    ([*SGLANG, "--rollout-num-gpus", "2"], r"the trainer's GPUs \(--actor-num-gpus-per-node × --actor-num-nodes = 1\) "
                                           r"must be the engines' \(--rollout-num-gpus 2\)"),
])
def test_settings_that_cannot_time_share_fail_at_start_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config([*REQUIRED, *flags])


def test_pipeline_stages_are_refused_they_lack_the_full_weights():
    # The rule itself, without parsing the Megatron flags (their generation costs seconds of imports).
    config = replace(parse_run_config([*REQUIRED, "--engine-type", "cpu"]),
                     trainer=TrainerConfig(hf_checkpoint="model/", megatron={"pipeline_model_parallel_size": 2}))
    with pytest.raises(ValueError, match="--colocate with --pipeline-model-parallel-size 2"):
        config.validate()


def test_the_transport_left_unset_is_disk_without_colocate_and_the_resolved_config_loads_back():
    config = parse_run_config([*REQUIRED[:-1], "--engine-type", "cpu"])
    assert config.train.update_weight_transport == "disk"
    assert config.resolve() == config


def test_the_tensor_transport_without_colocate_is_accepted_for_engines_resident_on_the_trainers_devices():
    # Both resident on one GPU (fully-async or one-step-off): whether the engines really are on the
    # trainer's devices is checked at start (actors/weight_sync/tensor.py, tests/loop/test_tensor_transport.py).
    config = parse_run_config([*REQUIRED[:-1], "--update-weight-transport", "tensor", "--train-mode", "fully-async"])
    assert config.train.update_weight_transport == "tensor" and not config.train.colocate


def test_the_cli_prints_one_line_without_a_traceback(capsys):
    assert COMMANDS["train"][0]([*REQUIRED, "--train-mode", "fully-async"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "--colocate" in err
