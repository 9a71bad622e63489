"""On-policy distillation's flags (slime's names) fail at start in one line naming the flag:
what each --opd-type needs and refuses, and a teacher whose tokenizer is not the student's."""

from __future__ import annotations

import json

import pytest

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.loop.cli import COMMANDS
from actors.loop.run_config import parse_run_config
from examples.models.tiny import build_tiny_model, generate_corpus
from slime_async.config.flags import ConfigError
from slime_async.config.loader import preflight


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_config")
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    return {"root": root, "prompts": prompts, "student": build_tiny_model(root / "student", seed=0),
            "teacher": build_tiny_model(root / "teacher", seed=1, corpus=generate_corpus(0)),
            "other_vocab": build_tiny_model(root / "other_vocab", vocab_size=400, seed=1)}


def argv(files, *extra: str) -> list[str]:
    return ["--hf-checkpoint", str(files["student"]), "--prompt-data", str(files["prompts"]), *extra]


def test_both_placements_parse_with_slimes_flags(files):
    engine = parse_run_config(argv(files, "--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "0.5",
                                   "--opd-teacher-hf-checkpoint", str(files["teacher"]), "--rm-type", "none"))
    assert engine.algorithm.use_opd and engine.algorithm.opd_kl_coef == 0.5
    assert engine.engine.opd_teacher_hf_checkpoint == str(files["teacher"])
    preflight(engine)
    megatron = parse_run_config(argv(files, "--use-opd", "--opd-type", "megatron",
                                     "--opd-teacher-load", str(files["teacher"])))
    assert megatron.trainer.opd_teacher_load == str(files["teacher"])
    preflight(megatron)


@pytest.mark.parametrize("extra, message", [
    (["--use-opd"], "--use-opd needs --opd-type"),
    (["--opd-type", "sglang"], "--opd-type sglang needs --use-opd"),
    (["--use-opd", "--opd-type", "sglang", "--opd-kl-coef", "0"], "--opd-kl-coef must be > 0"),
    (["--use-opd", "--opd-type", "megatron"], "--opd-type megatron needs --opd-teacher-load"),
    (["--use-opd", "--opd-type", "sglang"], "--opd-type sglang needs --opd-teacher-hf-checkpoint"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", "http://127.0.0.1:1", "--opd-teacher-load", "t"],
     "--opd-teacher-load is the trainer-side teacher"),
    (["--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "t", "--opd-teacher-url", "http://127.0.0.1:1"],
     "--opd-teacher-url is the engine teacher"),
    (["--use-opd", "--opd-type", "sglang", "--opd-teacher-url", "http://127.0.0.1:1",
      "--opd-teacher-hf-checkpoint", "t"], "exclude each other"),
    (["--opd-teacher-url", "http://127.0.0.1:1"], "--opd-teacher-url needs --use-opd --opd-type sglang"),
])
def test_a_teacher_that_does_not_fit_the_opd_type_is_refused_naming_the_flag(files, extra, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config(argv(files, *extra))


def test_a_teacher_with_another_tokenizer_is_refused_at_start(files, capsys):
    run_dir = files["root"] / "run-tokenizer"
    code = COMMANDS["train"][0](argv(files, "--use-opd", "--opd-type", "sglang", "--opd-teacher-hf-checkpoint",
                                     str(files["other_vocab"]), "--run-dir", str(run_dir)))
    assert code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--opd-teacher-hf-checkpoint" in lines[0] and "share a tokenizer" in lines[0], err
    assert out == "" and not run_dir.exists()


def test_an_external_teacher_serving_another_tokenizer_is_refused_at_start(files, capsys):
    # The directory its /model_info names is readable here: checked like an owned teacher's.
    process, url = start_local_engine(files["other_vocab"], files["root"] / "teacher-engine.log")
    try:
        run_dir = files["root"] / "run-url-tokenizer"
        code = COMMANDS["train"][0](argv(files, "--use-opd", "--opd-type", "sglang", "--opd-teacher-url", url,
                                         "--run-dir", str(run_dir)))
    finally:
        stop_local_engine(process)
    assert code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--opd-teacher-url" in lines[0] and "share a tokenizer" in lines[0], err
    assert str(files["other_vocab"]) in lines[0] and out == "" and not run_dir.exists()


def test_an_opd_teacher_load_that_is_no_model_is_named(files):
    empty = files["root"] / "empty"
    empty.mkdir(exist_ok=True)
    config = parse_run_config(argv(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(empty)))
    with pytest.raises(ConfigError, match="--opd-teacher-load .* is neither an HF directory"):
        preflight(config)


def test_pure_distillation_needs_no_label(files):
    config = parse_run_config(argv(files, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load",
                                   str(files["teacher"]), "--rm-type", "none"))
    assert config.rollout.rm_type == "none"
    preflight(config)


def test_an_engine_teacher_at_another_rollout_temperature_is_refused_at_start(files, capsys):
    # OPD compares student and teacher at the rollout temperature; an engine teacher (SGLang 0.5.17)
    # scores the given tokens at temperature 1 only (policies/opd.py).
    run_dir = files["root"] / "run-temperature"
    code = COMMANDS["train"][0](argv(files, "--use-opd", "--opd-type", "sglang", "--opd-teacher-hf-checkpoint",
                                     str(files["student"]), "--rollout-temperature", "0.7", "--run-dir", str(run_dir)))
    assert code == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--opd-type sglang with --rollout-temperature 0.7" in lines[0], err
    assert "--opd-type megatron" in lines[0]
    assert out == "" and not run_dir.exists()


@pytest.mark.parametrize("opd, temperature", [
    (["--opd-type", "sglang", "--opd-teacher-url", "http://127.0.0.1:1"], "1.0"),
    (["--opd-type", "sglang", "--opd-teacher-url", "http://127.0.0.1:1"], "0"),  # greedy: logprobs at 1
    (["--opd-type", "megatron", "--opd-teacher-load", "t"], "0.7"),  # the trainer forwards it at 0.7
])
def test_a_teacher_that_can_score_at_the_rollout_temperature_is_accepted(files, opd, temperature):
    config = parse_run_config(argv(files, "--use-opd", *opd, "--rollout-temperature", temperature))
    assert config.algorithm.opd_type == opd[1]
