"""--rollout-share-trainer-gpus: SGLang engines resident on the trainer's GPUs (a one-GPU host),
without colocation; a transport that cannot work there fails at start, one line naming the flags."""

import pytest

from actors.loop.cli import COMMANDS
from actors.loop.launch import engines_first_gpu
from actors.loop.run_config import parse_run_config
from slime_async.config.flags import ConfigError

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2"]
SHARE = ["--engine-type", "sglang", "--rollout-share-trainer-gpus"]


@pytest.mark.parametrize(("flags", "first"), [
    ([], 1),  # the engines after the trainer's one GPU
    (SHARE, 0),
    ([*SHARE, "--update-weight-transport", "tensor"], 0),
    ([*SHARE, "--weight-update-mode", "in_place"], 0),
    (["--update-weight-transport", "tensor"], 0),  # IPC handles: both resident, as before
])
def test_the_engines_start_on_gpu_0_when_they_share_the_trainers_gpus(flags, first):
    config = parse_run_config([*REQUIRED, *flags])
    assert engines_first_gpu(config, trainer_gpus=1) == first


def test_shared_gpus_move_weights_by_disk_unless_told_otherwise():
    config = parse_run_config([*REQUIRED, *SHARE])
    assert config.engine.rollout_share_trainer_gpus and config.train.update_weight_transport == "disk"
    assert not config.train.colocate and config.resolve() == config


@pytest.mark.parametrize(("flags", "message"), [
    (["--update-weight-transport", "distributed"], r"--rollout-share-trainer-gpus with --update-weight-transport "
                                                   r"distributed: an engine and a trainer rank on one GPU"),
    (["--colocate", "--sglang-enable-memory-saver"], r"--rollout-share-trainer-gpus with --colocate"),
    (["--engine-type", "cpu"], r"--rollout-share-trainer-gpus with --engine-type cpu"),
    (["--engine-type", "external", "--rollout-external-engine-addrs", "http://h:1"],
     r"--rollout-share-trainer-gpus with --engine-type external"),
])
def test_what_cannot_share_a_gpu_fails_at_start_naming_the_flags(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config([*REQUIRED, *SHARE, *flags])


def test_the_cli_prints_one_line_without_a_traceback(capsys):
    assert COMMANDS["train"][0]([*REQUIRED, *SHARE, "--update-weight-transport", "distributed"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--rollout-share-trainer-gpus" in err
