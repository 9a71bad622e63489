"""The run config: files, flags, pass-through, validation — all before anything is spawned."""

import pytest
import yaml

from slime_async.config.flags import ConfigError
from slime_async.config.loader import config_to_dict, dump_config
from actors.loop.run_config import parse_run_config

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/"]


def test_defaults_need_only_the_data_and_the_model():
    config = parse_run_config(REQUIRED)
    assert config.rollout.prompt_data == "p.jsonl"
    assert config.trainer.hf_checkpoint == "model/"
    assert config.rollout.n_samples_per_prompt == 4


def test_a_toml_file_is_loaded_by_section(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[rollout]\nprompt_data = "data.jsonl"\nn_samples_per_prompt = 8\n'
        '[trainer]\nhf_checkpoint = "m"\n'
        '[algorithm]\neps_clip = 0.25\nuse_tis = true\n'
        '[megatron]\nlr = 1e-5\ntensor_model_parallel_size = 2\n'
        '[sglang]\nmem_fraction_static = 0.7\n'
    )
    config = parse_run_config(["--config", str(path)])
    assert config.rollout.n_samples_per_prompt == 8
    assert config.algorithm.eps_clip == 0.25 and config.algorithm.use_tis is True
    assert config.trainer.megatron == {"lr": 1e-5, "tensor_model_parallel_size": 2}
    assert config.engine.sglang == {"mem_fraction_static": 0.7}


def test_a_yaml_file_is_loaded_and_flat_keys_find_their_section(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("prompt_data: d.jsonl\nhf_checkpoint: m\nrollout:\n  rollout_batch_size: 16\n")
    config = parse_run_config(["--config", str(path)])
    assert config.rollout.prompt_data == "d.jsonl"
    assert config.rollout.rollout_batch_size == 16


def test_command_line_flags_override_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\nprompt_data = "d.jsonl"\nrollout_batch_size = 16\n[trainer]\nhf_checkpoint = "m"\n')
    config = parse_run_config(["--config", str(path), "--rollout-batch-size", "4", "--no-rollout-shuffle"])
    assert config.rollout.rollout_batch_size == 4
    assert config.rollout.rollout_shuffle is False


def test_an_unknown_flag_suggests_the_nearest_names():
    with pytest.raises(ConfigError, match=r"unknown flag --n-sample-per-prompt \(did you mean --n-samples-per-prompt"):
        parse_run_config([*REQUIRED, "--n-sample-per-prompt", "8"])


def test_an_unknown_file_key_suggests_the_nearest_names(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[rollout]\nrollout_batch_sise = 4\n')
    with pytest.raises(ConfigError, match=r"rollout_batch_sise.*did you mean rollout_batch_size"):
        parse_run_config(["--config", str(path)])


def test_a_wrong_type_names_the_flag():
    with pytest.raises(ConfigError, match=r"--rollout-batch-size: 'eight' is not an integer"):
        parse_run_config([*REQUIRED, "--rollout-batch-size", "eight"])


def test_a_literal_flag_rejects_values_outside_its_choices():
    with pytest.raises(ConfigError, match=r"--train-mode: 'async' is not one of sync, one-step-off, fully-async"):
        parse_run_config([*REQUIRED, "--train-mode", "async"])


def test_a_runtime_owned_sglang_flag_is_rejected_with_the_flag_that_sets_it():
    with pytest.raises(ConfigError, match=r"--sglang-port .* is set by the runtime.*--engine-base-port"):
        parse_run_config([*REQUIRED, "--sglang-port", "30000"])


def test_sglang_flags_are_passed_through_raw_without_sglang_installed():
    config = parse_run_config([*REQUIRED, "--sglang-mem-fraction-static", "0.7", "--sglang-enable-metrics",
                               "--sglang-cuda-graph-bs", "1", "2", "4"])
    assert config.engine.sglang == {"mem_fraction_static": "0.7", "enable_metrics": True, "cuda_graph_bs": ["1", "2", "4"]}


def test_a_megatron_field_reaches_the_trainer_config_with_its_type():
    config = parse_run_config([*REQUIRED, "--tensor-model-parallel-size", "2", "--lr", "3e-6", "--clip-grad", "0.5",
                               "--overlap-grad-reduce", "--bf16"])
    megatron = config.trainer.megatron
    assert megatron["tensor_model_parallel_size"] == 2 and isinstance(megatron["tensor_model_parallel_size"], int)
    assert megatron["lr"] == 3e-6 and megatron["clip_grad"] == 0.5
    assert megatron["overlap_grad_reduce"] is True and megatron["bf16"] is True


def test_a_megatron_torch_dtype_field_takes_a_dtype_name():
    import torch

    config = parse_run_config([*REQUIRED, "--params-dtype", "bfloat16"])
    assert config.trainer.megatron["params_dtype"] is torch.bfloat16


def test_contradictory_combinations_fail_at_start():
    with pytest.raises(ConfigError, match=r"multiple of --global-batch-size"):
        parse_run_config([*REQUIRED, "--rollout-batch-size", "3", "--n-samples-per-prompt", "3",
                          "--global-batch-size", "4"])
    with pytest.raises(ConfigError, match=r"--max-staleness applies to --train-mode fully-async"):
        parse_run_config([*REQUIRED, "--train-mode", "sync", "--max-staleness", "2"])
    with pytest.raises(ConfigError, match=r"eps_clip_c"):
        parse_run_config([*REQUIRED, "--eps-clip-c", "0.5"])
    with pytest.raises(ConfigError, match=r"--max-run-restarts must be >= 0"):
        parse_run_config([*REQUIRED, "--max-run-restarts", "-1"])



def test_megatron_options_this_trainer_would_run_wrongly_fail_at_start():
    with pytest.raises(ConfigError, match=r"--lr-decay-style cosine needs --lr-decay-iters"):
        parse_run_config([*REQUIRED, "--lr-decay-style", "cosine", "--lr-warmup-iters", "10"])
    parse_run_config([*REQUIRED, "--lr-decay-style", "cosine", "--lr-decay-iters", "100"])  # fine with a length
    with pytest.raises(ConfigError, match=r"--virtual-pipeline-model-parallel-size is not supported with "
                                          r"--pipeline-model-parallel-size 2: the interleaved schedule"):
        parse_run_config([*REQUIRED, "--pipeline-model-parallel-size", "2", "--virtual-pipeline-model-parallel-size", "2"])
    with pytest.raises(ConfigError, match=r"drop --overlap-param-gather"):
        parse_run_config([*REQUIRED, "--use-distributed-optimizer", "--overlap-param-gather"])
    with pytest.raises(ConfigError, match=r"--sequence-parallel needs --tensor-model-parallel-size > 1"):
        parse_run_config([*REQUIRED, "--sequence-parallel"])


def test_missing_required_inputs_are_named():
    with pytest.raises(ConfigError, match=r"--prompt-data is required"):
        parse_run_config(["--hf-checkpoint", "m"])


def test_the_resolved_config_round_trips_through_config_yaml(tmp_path):
    config = parse_run_config([*REQUIRED, "--lr", "1e-5", "--sglang-log-level", "warning"])
    dump_config(config, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved == config_to_dict(config)
    assert saved["trainer"]["megatron"] == {"lr": 1e-5}
    assert saved["engine"]["sglang"] == {"log_level": "warning"}
