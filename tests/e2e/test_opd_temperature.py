"""On-policy distillation at a rollout temperature other than 1: a teacher identical to the student
adds nothing (issue #28's temperature bug: the teacher scored at temperature 1 while the student's
logprobs were at the rollout temperature, so the "reverse KL" of a model to itself was not 0).

Pure distillation (--rm-type none: every advantage is the OPD term alone), the student's own
checkpoint as the teacher, one sync step. Every token's term is 0, so the policy-gradient loss
has no gradient at all (no KL or entropy term): ``train/grad_norm`` is 0 — a per-token check,
where the mean ``train/opd_reverse_kl`` alone could hide terms that cancel.
- --opd-type megatron at rollout temperature 0.7: the frozen teacher is forwarded at it too;
- --opd-type sglang (an owned CPU engine teacher) at temperature 1, the only one an engine teacher
  takes (SGLang 0.5.17 scores the given tokens at temperature 1 whatever the request says;
  tests/config/test_opd_config.py has the refusal of any other). The engine's logprobs and the
  trainer's differ by float error only.
"""

import json

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_temperature")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}="}) + "\n" for a in range(4)))
    return {"root": root, "data": data, "model": build_tiny_model(root / "student", seed=0)}


def one_step(student, name: str, *extra: str) -> dict:
    root = student["root"] / name
    root.mkdir()
    run = train(root, ["--hf-checkpoint", str(student["model"]), "--prompt-data", str(student["data"]),
                       "--rm-type", "none", "--use-opd", "--opd-kl-coef", "1.0", "--train-mode", "sync",
                       "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                       "--rollout-max-response-len", "16", "--engine-type", "cpu", "--micro-batch-size", "4",
                       "--lr", "1e-4", *extra])
    [step] = [m for m in run["metrics"] if "train/opd_reverse_kl" in m]
    assert step["train/opd_scored_fraction"] == 1.0
    return step


def test_a_megatron_teacher_equal_to_the_student_adds_nothing_at_rollout_temperature_0_7(student):
    step = one_step(student, "megatron", "--rollout-temperature", "0.7",
                    "--opd-type", "megatron", "--opd-teacher-load", str(student["model"]))
    assert abs(step["train/opd_reverse_kl"]) < 1e-6  # measured: exactly 0 (one forward code, one weights)
    assert step["train/grad_norm"] < 1e-6


def test_an_engine_teacher_equal_to_the_student_adds_nothing(student):
    step = one_step(student, "engine", "--rollout-temperature", "1.0",
                    "--opd-type", "sglang", "--opd-teacher-hf-checkpoint", str(student["model"]))
    # float error only (measured 7e-9 and 4e-7; a teacher at the wrong temperature gives ~1e-2 and ~0.2)
    assert abs(step["train/opd_reverse_kl"]) < 1e-6
    assert step["train/grad_norm"] < 1e-4
