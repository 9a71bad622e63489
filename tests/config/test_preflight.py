"""Every configuration and path error fails at start, before anything is spawned, in one line
naming the flag: values the trainer would reject (learning rate, batch sizes), paths that do not
exist or do not hold a model, hooks that do not import or take the wrong arguments, unknown
built-in rewards. In-process (parse + preflight) for most cases; `slime-async train` as a
process for a few, checking the exit code, the single stderr line and that nothing started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from actors.loop.cli import COMMANDS

from slime_async.config.flags import ConfigError
from slime_async.config.loader import preflight
from actors.loop.run_config import parse_run_config
from examples.models.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[2]

HOOKS = textwrap.dedent('''
    async def rm(ctx, sample):
        return 1.0

    async def rm_without_sample(ctx):
        return 1.0

    async def generate_two_args(ctx, sample):
        return sample

    def filter_three(a, b, c):
        return True

    def filter_ctx_rewards(ctx, rewards):  # native style (first parameter not `args`): called fn(rewards)
        return True

    def slime_filter(args, samples):
        return True
''')


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("preflight")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    (root / "preflight_hooks.py").write_text(HOOKS)
    (root / "preflight_broken.py").write_text("def rm(ctx, sample)\n    return 1.0\n")
    (root / "preflight_raises.py").write_text("import os\nKEY = os.environ['NO_SUCH_KEY_XYZ']\n\n"
                                              "async def generate(ctx, sample, sampling_params):\n    return sample\n")
    (root / "preflight_needs_missing_dep.py").write_text("import no_such_dependency_xyz\n\ndef rm(ctx, sample):\n"
                                                         "    return 1.0\n")
    (root / "settings.bin").write_bytes(b"\xff\xfe\x00config")
    no_tokenizer = root / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model / name, no_tokenizer / name)
    no_weights = root / "no_weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model / name, no_weights / name)
    (root / "empty").mkdir()
    sys.path.insert(0, str(root))
    yield {"root": root, "model": model, "prompts": root / "prompts.jsonl"}
    sys.path.remove(str(root))


def base(files) -> list[str]:
    return ["--hf-checkpoint", str(files["model"]), "--prompt-data", str(files["prompts"])]


def check(argv: list[str]) -> None:
    preflight(parse_run_config(argv))


def test_a_good_config_passes(files):
    check(base(files) + ["--custom-rm-path", "preflight_hooks:rm"])


CASES = {
    "hf_checkpoint_missing": (["--hf-checkpoint", "{root}/nowhere"], r"--hf-checkpoint \S+/nowhere: no such directory"),
    "hf_checkpoint_no_config": (["--hf-checkpoint", "{root}/empty"], r"--hf-checkpoint \S+/empty: no config.json"),
    "hf_checkpoint_no_tokenizer": (["--hf-checkpoint", "{root}/no_tokenizer"], r"--hf-checkpoint \S+: no tokenizer"),
    "hf_checkpoint_no_weights": (["--hf-checkpoint", "{root}/no_weights"], r"--hf-checkpoint \S+: no model weights"),
    "ref_load_missing": (["--ref-load", "{root}/nowhere"], r"--ref-load \S+: no such directory"),
    "lr_negative": (["--lr", "-0.001"], r"--lr must be >= 0, got -0.001"),
    "min_lr_negative": (["--min-lr", "-1e-6"], r"--min-lr must be >= 0"),
    "weight_decay_negative": (["--weight-decay", "-0.1"], r"--weight-decay must be >= 0"),
    "adam_beta2_one": (["--adam-beta2", "1.0"], r"--adam-beta2 must be in \[0, 1\)"),
    "micro_batch_size_zero": (["--micro-batch-size", "0"], r"--micro-batch-size must be > 0, got 0"),
    "global_batch_size_negative": (["--global-batch-size", "-4"], r"--global-batch-size must be > 0, got -4"),
    "max_tokens_per_gpu_zero": (["--max-tokens-per-gpu", "0"], r"--max-tokens-per-gpu must be > 0"),
    "rollout_batch_size_zero": (["--rollout-batch-size", "0"], r"--rollout-batch-size must be > 0"),
    "n_samples_per_prompt_zero": (["--n-samples-per-prompt", "0"], r"--n-samples-per-prompt must be > 0"),
    "eval_max_response_len_zero": (["--eval-max-response-len", "0"], r"--eval-max-response-len must be > 0"),
    "reward_timeout_zero": (["--reward-timeout", "0"], r"--reward-timeout must be > 0"),
    "prompt_data_missing": (["--prompt-data", "{root}/nowhere.jsonl"], r"--prompt-data \S+/nowhere.jsonl: no such file"),
    "eval_prompt_data_missing": (["--eval-prompt-data", "held", "{root}/nowhere.jsonl"],
                                 r"--eval-prompt-data \S+/nowhere.jsonl: no such file"),
    "load_missing": (["--load", "{root}/no_checkpoint"], r"--load \S+/no_checkpoint: no such directory"),
    "rm_not_importable": (["--custom-rm-path", "no_such_module:rm"],
                          r"--custom-rm-path no_such_module:rm: cannot import module"),
    "rm_module_broken": (["--custom-rm-path", "preflight_broken:rm"],
                         r"--custom-rm-path preflight_broken:rm: importing module 'preflight_broken' failed: "
                         r"SyntaxError: .*"
                         r"\(at .*preflight_broken.py:1\)"),
    "generate_module_raises": (["--custom-generate-function-path", "preflight_raises:generate"],
                               r"--custom-generate-function-path preflight_raises:generate: importing module "
                               r"'preflight_raises' failed: KeyError: 'NO_SUCH_KEY_XYZ' \(at .*preflight_raises.py:2 "
                               r"in <module>\)$"),
    "rm_no_such_function": (["--custom-rm-path", "preflight_hooks:nope"],
                            r"--custom-rm-path preflight_hooks:nope: module .* has no function"),
    "rm_wrong_signature": (["--custom-rm-path", "preflight_hooks:rm_without_sample"],
                           r"--custom-rm-path preflight_hooks:rm_without_sample: rm_without_sample\(ctx\) does not "
                           r"take the arguments it will be called with: rm\(ctx, sample\)"),
    "generate_wrong_signature": (["--custom-generate-function-path", "preflight_hooks:generate_two_args"],
                                 r"--custom-generate-function-path .*generate\(ctx, sample, sampling_params\)"),
    "rollout_function_wrong_signature": (["--rollout-function-path", "preflight_hooks:rm"],
                                         r"--rollout-function-path .*rollout_group\(ctx, samples, sampling_params\)"),
    "filter_wrong_signature": (["--dynamic-sampling-filter-path", "preflight_hooks:filter_three"],
                               r"--dynamic-sampling-filter-path .*filter_three\(a, b, c\) .*: fn\(rewards\)$"),
    "filter_native_with_two_parameters": (["--dynamic-sampling-filter-path", "preflight_hooks:filter_ctx_rewards"],
                                          r"--dynamic-sampling-filter-path .*filter_ctx_rewards\(ctx, rewards\) does "
                                          r"not take the arguments it will be called with: fn\(rewards\)"),
    "rm_type_unknown": (["--rm-type", "deepscaler"],
                        r"--rm-type 'deepscaler' is not a built-in reward: choose one of none, math, exact, f1"),
    "config_file_missing": (["--config", "{root}/nowhere.toml"], r"--config \S+/nowhere.toml: no such file"),
    "config_file_a_directory": (["--config", "{root}/empty"], r"--config \S+/empty: not a file"),
    "config_file_not_text": (["--config", "{root}/settings.bin"], r"--config \S+/settings.bin: not a UTF-8 text file"),
    "prompt_data_unsupported_format": (["--prompt-data", "{root}/preflight_hooks.py"],
                                       r"--prompt-data \S+/preflight_hooks.py: unsupported format '.py' \(a .jsonl"),
    "eval_prompt_data_unsupported_format": (["--eval-prompt-data", "held", "{root}/preflight_hooks.py"],
                                            r"--eval-prompt-data \S+/preflight_hooks.py: unsupported format '.py'"),
    "run_dir_under_a_file": (["--run-dir", "{root}/prompts.jsonl/run"],
                             r"--run-dir \S+/prompts.jsonl/run: not a directory \(\S+/prompts.jsonl is a file\)"),
    "save_a_file": (["--save", "{root}/prompts.jsonl"], r"--save \S+/prompts.jsonl: not a directory$"),
    "prompt_data_a_directory": (["--prompt-data", "{root}/empty"], r"--prompt-data \S+/empty: not a file"),
    "tensorboard_dir_under_a_file": (["--tensorboard-dir", "{root}/prompts.jsonl/tb"],
                                     r"--tensorboard-dir \S+/prompts.jsonl/tb: not a directory"),
    "trace_dir_under_a_file": (["--trace-dir", "{root}/prompts.jsonl/trace"],
                               r"--trace-dir \S+/prompts.jsonl/trace: not a directory"),
    "trace_max_events_zero": (["--trace-dir", "{root}/trace", "--trace-max-events", "0"],
                              r"--trace-max-events must be >= 1, got 0"),
    "save_debug_rollout_data_under_a_file": (["--save-debug-rollout-data", "{root}/prompts.jsonl/dump"],
                                             r"--save-debug-rollout-data \S+/prompts.jsonl/dump: not a directory"),
    "abbreviated_flag": (["--max-stal", "2"], r"unknown flag --max-stal"),
    "hf_checkpoint_a_file": (["--hf-checkpoint", "{root}/prompts.jsonl"], r"--hf-checkpoint \S+: not a directory"),
    "critic_load_missing": (["--advantage-estimator", "ppo", "--critic-load", "{root}/nowhere"],
                            r"--critic-load \S+/nowhere: no critic checkpoint there"),
    "load_debug_rollout_data_missing": (["--debug-train-only", "--load-debug-rollout-data", "{root}/nowhere"],
                                        r"--load-debug-rollout-data \S+/nowhere: no such directory"),
    "debug_hold_weight_sync_missing": (["--debug-hold-weight-sync", "{root}/nowhere"],
                                       r"--debug-hold-weight-sync \S+/nowhere: no such directory"),
    "custom_config_path_missing": (["--custom-config-path", "{root}/nowhere.yaml"],
                                   r"--custom-config-path \S+/nowhere.yaml: no such file"),
    "custom_config_path_a_directory": (["--custom-config-path", "{root}/empty"],
                                       r"--custom-config-path \S+/empty: not a file"),
    "rm_module_not_on_the_path": (["--custom-rm-path", "not_on_sys_path:rm"],
                                  r"--custom-rm-path not_on_sys_path:rm: cannot import module 'not_on_sys_path'.*"
                                  r"add the directory that "
                                  r"holds it to PYTHONPATH"),
    "rm_dependency_missing": (["--custom-rm-path", "preflight_needs_missing_dep:rm"],
                              r"--custom-rm-path preflight_needs_missing_dep:rm: cannot import module "
                              r"'preflight_needs_missing_dep': No module named "
                              r"'no_such_dependency_xyz'$"),
    "generate_not_importable": (["--custom-generate-function-path", "no_such_module.generate"],
                                r"--custom-generate-function-path no_such_module.generate: cannot import module "
                                r"'no_such_module'"),
    "rollout_function_not_importable": (["--rollout-function-path", "no_such_module:rollout"],
                                        r"--rollout-function-path no_such_module:rollout: cannot import module "
                                        r"'no_such_module'"),
    "filter_not_importable": (["--dynamic-sampling-filter-path", "no_such_module:keep"],
                              r"--dynamic-sampling-filter-path no_such_module:keep: cannot import "
                              r"module 'no_such_module'"),
    "hook_path_a_file": (["--custom-rm-path", "hooks/my_rm.py:rm"],
                         r"--custom-rm-path: 'hooks/my_rm.py:rm' names a file; name the module as Python imports it "
                         r"\(my_rm:rm, with its directory on PYTHONPATH\)"),
    "hook_path_without_a_function": (["--custom-rm-path", "preflight_hooks"],
                                     r"--custom-rm-path: expected package.module:function or package.module.function"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_config_fails_in_one_line_naming_the_flag(files, case):
    extra, message = CASES[case]
    argv = base(files) + [arg.format(root=files["root"]) for arg in extra]
    with pytest.raises(ConfigError, match=message) as raised:
        check(argv)
    assert "\n" not in str(raised.value)


def test_a_custom_reward_may_leave_rm_type_at_a_slime_name(files):
    # slime's rm_type names (deepscaler, dapo) are read by slime-style plug-ins, not by the runtime.
    check(base(files) + ["--rm-type", "deepscaler", "--custom-rm-path", "preflight_hooks:rm"])


def test_a_builtin_filter_needs_no_import(files):
    check(base(files) + ["--dynamic-sampling-filter-path", "nonuniform"])


def test_slimes_two_argument_filter_passes(files):
    check(base(files) + ["--dynamic-sampling-filter-path", "preflight_hooks:slime_filter"])


def test_a_run_dir_that_does_not_exist_yet_passes(files, tmp_path):
    check(base(files) + ["--run-dir", str(tmp_path / "new" / "run"), "--save", str(tmp_path / "new" / "ckpt")])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes whatever the mode")
def test_a_run_dir_in_a_read_only_directory_is_named(files, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    with pytest.raises(ConfigError, match=r"--run-dir \S+/locked/run: \S+/locked is not writable"):
        check(base(files) + ["--run-dir", str(locked / "run")])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_prompt_file_is_named(files, tmp_path):
    locked = tmp_path / "locked.jsonl"
    locked.write_text(files["prompts"].read_text())
    locked.chmod(0)
    with pytest.raises(ConfigError, match=r"--prompt-data \S+/locked.jsonl: not readable"):
        check(base(files) + ["--prompt-data", str(locked)])


@pytest.mark.slow  # a `slime-async train` process (~5 s on an idle 2-core machine)
def test_slime_async_train_exits_2_with_one_line_before_starting_anything(files):
    run_dir = files["root"] / "run-hf-checkpoint"
    argv = base(files) + ["--hf-checkpoint", str(files["root"] / "nowhere"), "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(files["root"]), str(REPO)])}
    result = subprocess.run([sys.executable, "-m", "actors.loop.cli", "train", *argv], capture_output=True, text=True,
                            timeout=120, env=env, cwd=files["root"])
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slime-async train: error:") and "--hf-checkpoint" in lines[0]
    assert result.stdout == ""  # not even the config: it is printed once the run starts
    assert not run_dir.exists()  # the run never started: no run dir, no config dump, no children


# The same through the CLI's train command in this process (a process each cost ~5 s of imports).
@pytest.mark.parametrize("extra, flag", [
    (["--lr", "-0.001"], "--lr"),
    (["--custom-rm-path", "preflight_hooks:rm_without_sample"], "--custom-rm-path"),
    (["--custom-generate-function-path", "no_such_module:generate"], "--custom-generate-function-path"),
])
def test_the_train_command_returns_2_with_one_line_before_starting_anything(files, extra, flag, capsys):
    run_dir = files["root"] / f"run-{flag.strip('-')}"
    argv = base(files) + [arg.format(root=files["root"]) for arg in extra] + ["--run-dir", str(run_dir)]
    assert COMMANDS["train"][0](argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slime-async train: error:") and flag in lines[0], err
    assert out == "" and not run_dir.exists()
