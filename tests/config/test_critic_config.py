"""--advantage-estimator ppo and the critic's flags: settings that cannot work fail at start, one line
naming the flag."""


import pytest

from actors.loop.cli import COMMANDS

from actors.critic.config import CriticConfig, critic_trainer_config
from actors.megatron.config import TrainerConfig
from slime_async.config.flags import ConfigError
from actors.loop.run_config import parse_run_config

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2"]
PPO = [*REQUIRED, "--advantage-estimator", "ppo"]


def test_ppo_with_the_critic_flags_is_accepted():
    config = parse_run_config([*PPO, "--critic-lr", "1e-5", "--num-critic-only-steps", "3", "--value-clip", "0.5",
                               "--lambd", "0.95", "--gamma", "0.99"])
    assert (config.critic.critic_lr, config.critic.num_critic_only_steps, config.critic.value_clip,
            config.critic.lambd, config.algorithm.gamma) == (1e-5, 3, 0.5, 0.95, 0.99)


@pytest.mark.parametrize(("flags", "message"), [
    (["--critic-lr", "1e-5"], r"--critic-lr applies to --advantage-estimator ppo \(a critic\), not grpo"),
    (["--num-critic-only-steps", "2"], r"--num-critic-only-steps applies to --advantage-estimator ppo"),
    (["--value-clip", "0.5"], r"--value-clip applies to --advantage-estimator ppo"),
    (["--advantage-estimator", "ppo", "--loss-type", "sft"], r"it does not apply to --loss-type sft"),
    (["--advantage-estimator", "ppo", "--debug-rollout-only"], r"--debug-rollout-only does not start"),
    (["--advantage-estimator", "ppo", "--value-clip", "0"], r"--value-clip must be > 0"),
    (["--advantage-estimator", "ppo", "--lambd", "1.5"], r"--lambd must be in \[0, 1\]"),
    (["--advantage-estimator", "ppo", "--num-critic-only-steps", "-1"], r"--num-critic-only-steps must be >= 0"),
    (["--advantage-estimator", "ppo", "--critic-lr", "0"], r"--critic-lr must be > 0"),
    (["--advantage-estimator", "ppo", "--critic-load", "/nonexistent/critic"], r"--critic-load /nonexistent/critic: "
                                                                                r"no critic checkpoint there"),
])
def test_settings_that_cannot_work_fail_at_start_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config([*REQUIRED, *flags])


def test_critic_load_accepts_a_step_directory_or_a_save_root(tmp_path):
    critic = tmp_path / "save" / "step_000004" / "critic"
    critic.mkdir(parents=True)
    (critic / "metadata.json").write_text("{}")
    (tmp_path / "save" / "latest").write_text("step_000004")
    for path in (critic, critic.parent, tmp_path / "save"):
        assert parse_run_config([*PPO, "--critic-load", str(path)]).critic.critic_load == str(path)


def test_the_critic_group_gets_its_own_learning_rate_and_no_reference():
    trainer = TrainerConfig(hf_checkpoint="m", use_reference=True, ref_load="r", megatron={"lr": 1e-6, "clip_grad": 1.0})
    critic = critic_trainer_config(trainer, CriticConfig(critic_lr=1e-5))
    assert critic.megatron == {"lr": 1e-5, "clip_grad": 1.0}
    assert not critic.use_reference and critic.ref_load is None
    assert critic_trainer_config(trainer, CriticConfig()).megatron["lr"] == 1e-6  # default: --lr


def test_the_cli_prints_one_line_without_a_traceback(capsys):
    # The CLI's train command in this process (a process of its own cost ~5 s of imports).
    assert COMMANDS["train"][0]([*REQUIRED, "--critic-lr", "1e-5"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--critic-lr applies to --advantage-estimator ppo" in err


@pytest.mark.parametrize(("flags", "policy_gpus", "gpu_count", "first"), [
    (["--engine-type", "sglang", "--rollout-num-gpus", "2"], 2, 8, 2),  # 2 policy + 2 critic + 2 engines fit
    (["--engine-type", "sglang", "--rollout-num-gpus", "2"], 2, 4, 0),  # too few: the critic shares 0-1
    (["--engine-type", "external", "--rollout-external-engine-addrs", "http://h:1"], 1, 2, 1),
    (["--engine-type", "external", "--rollout-external-engine-addrs", "http://h:1"], 1, 1, 0),  # one GPU
    (["--engine-type", "sglang", "--rollout-share-trainer-gpus"], 1, 2, 1),  # the engine sits on GPU 0
])
def test_the_critic_takes_the_gpus_after_the_policys_when_the_host_has_them(flags, policy_gpus, gpu_count, first):
    from actors.loop.launch import critic_gpu_offset

    assert critic_gpu_offset(parse_run_config([*PPO, *flags]), policy_gpus, gpu_count) == first
