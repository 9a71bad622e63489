"""build_train_batch with on-policy distillation: the reverse-KL term on top of the estimator.

One group of two samples (Dr. GRPO: advantages r − mean), rewards 1 and 0 -> +0.5 and −0.5:
    s0: three generated tokens, loss mask [1, 1, 1]
    s1: a generated token, a tool-output token, a generated token: loss mask [1, 0, 1]
π_old (the trainer's recompute) and the teacher:
    s0: old [−1, −2, −0.5], teacher [−1.5, −2, 0.5]   -> reverse KL [0.5, 0, −1]
    s1: old [−1, −1, −1],  teacher [−0.5, −3, −2.5]   -> reverse KL [−0.5, (masked), 1.5]
opd_kl_coef 0.5:
    s0: 0.5 − 0.5·[0.5, 0, −1] = [0.25, 0.5, 1.0]
    s1: [−0.5, 0, −0.5] − 0.5·[−0.5, 0, 1.5] = [−0.25, 0, −1.25]
train/opd_reverse_kl = (0.5 + 0 − 1 − 0.5 + 1.5) / 5 model tokens = 0.1
"""

import pytest
import torch

from actors.loop.batching import build_train_batch
from policies.algorithm import AlgorithmConfig
from slime_async.sample import Sample, Status

OLD = [[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]]
TEACHER = [[-1.5, -2.0, 0.5], [-0.5, -3.0, -2.5]]
SPEC = AlgorithmConfig(advantage_estimator="dr_grpo", use_opd=True, opd_type="megatron", opd_kl_coef=0.5)


def group(rewards=(1.0, 0.0)) -> list[Sample]:
    s0 = Sample(group_index=0, index=0, prompt="p", tokens=[5, 6])
    s0.append_generated([7, 8, 9], [-1.1, -2.1, -0.6], version=0)
    s1 = Sample(group_index=0, index=1, prompt="p", tokens=[5, 6])
    s1.append_generated([7], [-1.1], version=0)
    s1.append_observation([30])  # a tool's output: not the model's token
    s1.append_generated([9], [-1.1], version=0)
    for sample, reward in zip((s0, s1), rewards):
        sample.reward, sample.status = reward, Status.COMPLETED
    return [s0, s1]


def close(actual, expected):
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), atol=1e-6, rtol=0)


def test_the_megatron_teachers_rows_adjust_any_estimators_advantages_on_model_tokens():
    batch, metrics = build_train_batch([group()], SPEC, train_version=0, temperature=1.0, old_logprobs=OLD,
                                       teacher_logprobs=TEACHER)
    close(batch.advantages[0], [0.25, 0.5, 1.0])
    close(batch.advantages[1], [-0.25, 0.0, -1.25])
    assert metrics["train/opd_reverse_kl"] == pytest.approx(0.1)
    assert metrics["train/opd_scored_fraction"] == 1.0


def test_the_engine_teachers_scores_come_from_the_samples_and_an_unscored_one_keeps_its_advantage():
    samples = group()
    samples[0].teacher_logprobs = TEACHER[0]  # s1: the teacher engine could not score it
    spec = AlgorithmConfig(advantage_estimator="dr_grpo", use_opd=True, opd_type="sglang", opd_kl_coef=0.5)
    batch, metrics = build_train_batch([samples], spec, train_version=0, temperature=1.0, old_logprobs=OLD)
    close(batch.advantages[0], [0.25, 0.5, 1.0])
    close(batch.advantages[1], [-0.5, 0.0, -0.5])
    assert metrics["train/opd_scored_fraction"] == pytest.approx(3 / 5)
    assert metrics["train/opd_reverse_kl"] == pytest.approx((0.5 + 0 - 1) / 3)


def test_pure_distillation_without_rewards_is_minus_coef_times_the_reverse_kl():
    # rewards all 0: GRPO gives 0 everywhere; only the OPD term is left
    spec = AlgorithmConfig(use_opd=True, opd_type="megatron", opd_kl_coef=1.0)
    batch, _ = build_train_batch([group(rewards=(0.0, 0.0))], spec, train_version=0, temperature=1.0,
                                 old_logprobs=OLD, teacher_logprobs=TEACHER)
    close(batch.advantages[0], [-0.5, 0.0, 1.0])
    close(batch.advantages[1], [0.5, 0.0, -1.5])


def test_opd_needs_the_students_old_logprobs():
    with pytest.raises(ValueError, match="π_old"):
        build_train_batch([group()], SPEC, train_version=0, temperature=1.0, teacher_logprobs=TEACHER)


def test_a_teacher_row_of_the_wrong_length_is_refused_naming_the_sample():
    with pytest.raises(ValueError, match="sample 0/1 has 2 teacher logprobs"):
        build_train_batch([group()], SPEC, train_version=0, temperature=1.0, old_logprobs=OLD,
                          teacher_logprobs=[TEACHER[0], TEACHER[1][:2]])
