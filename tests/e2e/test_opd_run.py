"""End-to-end on-policy distillation: `slime-async train` with a teacher, both placements.

Pure distillation (--rm-type none: every reward 0, so the teacher's reverse KL is the only
signal) of a tiny student by a tiny teacher of the same tokenizer and other weights:
- fully-async with an owned engine teacher (--opd-type sglang --opd-teacher-hf-checkpoint): the
  rollout has the teacher engine score every final sample, the trained samples carry its
  logprobs, and they are the teacher's of the final tokens (a transformers forward of the
  teacher agrees), also for samples whose generation a weight sync aborted and resumed;
- sync with a Megatron teacher in the trainer ranks (--opd-type megatron --opd-teacher-load).
"""

import json
import textwrap

import pytest
import torch
from transformers import AutoModelForCausalLM

from examples.models.tiny import build_tiny_model, generate_corpus
from train_process import train

STEPS = 3

LONG_GENERATE = textwrap.dedent('''
    from actors.rollout.generate import default_generate

    async def long_generate(ctx, sample, sampling_params):
        # The full budget, one generation at a time: weight syncs land mid-generation (resumes).
        return await default_generate(ctx, sample, {**sampling_params, "ignore_eos": True})
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd")
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}="}) + "\n" for a in range(16)))
    return {"root": root, "data": data, "student": build_tiny_model(root / "student", seed=0),
            "teacher": build_tiny_model(root / "teacher", seed=1, corpus=generate_corpus(0))}


def common(models, max_len: int = 24) -> list[str]:
    return ["--hf-checkpoint", str(models["student"]), "--prompt-data", str(models["data"]), "--rm-type", "none",
            "--use-opd", "--opd-kl-coef", "1.0", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--num-rollout", str(STEPS), "--rollout-max-response-len", str(max_len), "--engine-type", "cpu",
            "--micro-batch-size", "4", "--lr", "1e-4"]


@pytest.fixture(scope="module")
def engine_teacher_run(models):
    root = models["root"] / "engine"
    root.mkdir()
    (root / "opd_long_generate.py").write_text(LONG_GENERATE)
    # Staleness 2: the rollout may run two steps ahead, so it is still generating when the first sync
    # lands even where training is slow (at 1 it once finished its 4 samples and waited at the bound
    # before step 1's sync, and nothing was resumed).
    return train(root, [*common(models, max_len=256), "--train-mode", "fully-async", "--max-staleness", "2",
                        "--opd-type", "sglang", "--opd-teacher-hf-checkpoint", str(models["teacher"]),
                        "--rollout-concurrency", "1",
                        "--custom-generate-function-path", "opd_long_generate:long_generate"], import_dirs=(root,))


@pytest.fixture(scope="module")
def megatron_teacher_run(models):
    root = models["root"] / "megatron"
    root.mkdir()
    return train(root, [*common(models), "--train-mode", "sync",
                        "--opd-type", "megatron", "--opd-teacher-load", str(models["teacher"])])


def train_steps(metrics):
    return [m for m in metrics if "train/opd_reverse_kl" in m]


def test_every_fully_async_step_trains_on_the_engine_teachers_scores(engine_teacher_run):
    steps = train_steps(engine_teacher_run["metrics"])
    assert len(steps) == STEPS
    assert all(m["train/opd_scored_fraction"] == 1.0 for m in steps)
    # A step trained on groups scored before the previous step's row has no scored fraction of its own.
    scored = [m for m in steps if "rollout/opd_scored_fraction" in m]
    assert scored and all(m["rollout/opd_teacher_time"] > 0 and m["rollout/opd_scored_fraction"] == 1.0
                          for m in scored)
    assert all(m["rollout/reward_mean"] == 0.0 for m in steps if "rollout/reward_mean" in m)


def test_trained_samples_carry_the_teachers_logprobs_of_their_final_tokens(engine_teacher_run, models):
    teacher = AutoModelForCausalLM.from_pretrained(models["teacher"], dtype=torch.float32)
    samples = engine_teacher_run["samples"]
    assert samples and all(len(s["teacher_logprobs"]) == s["response_length"] for s in samples)
    resumed = [s for s in samples if s["metadata"].get("resumes")]
    assert resumed, "no weight sync landed during a generation"
    sample = resumed[0]  # scored once final: its tokens from before and after the abort
    tokens, n = sample["tokens"], sample["response_length"]
    with torch.no_grad():
        logits = teacher(torch.tensor([tokens])).logits[0].float()
    expected = torch.log_softmax(logits[len(tokens) - n - 1:-1], dim=-1).gather(
        1, torch.tensor(tokens[-n:])[:, None]).squeeze(1)
    assert sample["teacher_logprobs"] == pytest.approx(expected.tolist(), abs=1e-4)


def test_a_megatron_teacher_in_the_trainer_ranks_scores_every_step(megatron_teacher_run):
    steps = train_steps(megatron_teacher_run["metrics"])
    assert len(steps) == STEPS
    assert all(m["train/opd_scored_fraction"] == 1.0 for m in steps)
    # Two models of different weights: the reverse KL estimate is not zero.
    assert all(m["train/opd_reverse_kl"] != 0.0 for m in steps)
