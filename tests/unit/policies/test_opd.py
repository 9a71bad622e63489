"""On-policy distillation objective against hand-computed values."""

import math

import pytest
import torch

from policies.opd import apply_opd, opd_metrics, opd_reverse_kl, teacher_response_logprobs, teacher_temperature

# student log π = [-1.0, -0.5, -2.0], teacher = [-1.5, -0.5, -1.0]
# reverse_kl = student − teacher = [0.5, 0.0, -1.0]
STUDENT = torch.tensor([-1.0, -0.5, -2.0])
TEACHER = torch.tensor([-1.5, -0.5, -1.0])


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), atol=1e-6, rtol=0)


def test_reverse_kl_is_student_minus_teacher_on_model_tokens():
    close(opd_reverse_kl(STUDENT, TEACHER, torch.tensor([1, 1, 1])), [0.5, 0.0, -1.0])


def test_reverse_kl_is_zero_on_tokens_the_model_did_not_generate():
    # a tool-output token in the middle of a multi-turn sample: loss_mask 0
    close(opd_reverse_kl(STUDENT, TEACHER, torch.tensor([1, 0, 0])), [0.5, 0.0, 0.0])


def test_apply_opd_subtracts_coef_times_reverse_kl_from_any_advantage():
    # GRPO-style constant advantage 0.8, coef 0.5: 0.8 − 0.5·[0.5, 0, −1] = [0.55, 0.8, 1.3]
    adv, kl = apply_opd(torch.full((3,), 0.8), STUDENT, TEACHER, torch.tensor([1, 1, 1]), 0.5)
    close(adv, [0.55, 0.8, 1.3])
    close(kl, [0.5, 0.0, -1.0])


def test_pure_distillation_advantage_is_minus_coef_times_reverse_kl():
    # no reward: advantages 0; coef 1 -> [-0.5, 0, 1]
    adv, _ = apply_opd(torch.zeros(3), STUDENT, TEACHER, torch.tensor([1, 1, 1]), 1.0)
    close(adv, [-0.5, 0.0, 1.0])


def test_per_token_advantages_keep_their_shape_and_are_not_modified_in_place():
    # PPO/GAE advantages differ per token: [0.1, -0.2, 0.3] − 1·[0.5, 0, −1] = [-0.4, -0.2, 1.3]
    base = torch.tensor([0.1, -0.2, 0.3])
    adv, _ = apply_opd(base, STUDENT, TEACHER, torch.tensor([1, 1, 1]), 1.0)
    close(adv, [-0.4, -0.2, 1.3])
    close(base, [0.1, -0.2, 0.3])


def test_shape_mismatch_names_the_shapes():
    with pytest.raises(ValueError, match="must have one shape"):
        opd_reverse_kl(STUDENT, TEACHER[:2], torch.tensor([1, 1, 1]))


def test_teacher_logprobs_are_the_tail_of_sglang_input_token_logprobs():
    # prompt [5, 6], response [7, 8]: the first entry has no logprob (null)
    reply = [[None, 5, None], [-0.3, 6, None], [-1.25, 7, None], [-0.5, 8, None]]
    assert teacher_response_logprobs(reply, 2) == [-1.25, -0.5]
    assert teacher_response_logprobs(reply, 0) == []


def test_teacher_reply_shorter_than_the_response_is_refused():
    with pytest.raises(ValueError, match="too few"):
        teacher_response_logprobs([[None, 5, None], [-0.3, 6, None]], 2)


def test_metrics_mean_over_scored_model_tokens_and_scored_fraction():
    # reverse_kl [0.5, 0, -1, 2]; model tokens [1,1,1,0]; scored [1,1,0,1]
    # scored model tokens: 0 and 1 -> mean (0.5 + 0)/2 = 0.25; fraction 2/3
    m = opd_metrics(torch.tensor([0.5, 0.0, -1.0, 2.0]), torch.tensor([1, 1, 1, 0]), torch.tensor([1, 1, 0, 1]))
    assert m["train/opd_reverse_kl"] == pytest.approx(0.25)
    assert m["train/opd_scored_fraction"] == pytest.approx(2 / 3)


def test_the_teacher_scores_at_the_students_temperature_so_a_student_equal_to_it_adds_nothing():
    # One position, logits z = [0, ln 3], the sampled token 1, rollout temperature 0.5:
    #   at 1:   softmax(z)     = [1/4, 3/4]   -> log p = ln 0.75
    #   at 0.5: softmax(2z)    = [1/10, 9/10] -> log p = ln 0.9
    # The student's logprob is at 0.5 (the trainer's, as the sampler's). A teacher with the very same
    # logits scored at temperature 1 would leave ln 0.9 − ln 0.75 = ln 1.2 ≈ 0.1823 of "reverse KL".
    logits, token, rollout_temperature = torch.tensor([0.0, math.log(3.0)]), 1, 0.5
    student = torch.log_softmax(logits / rollout_temperature, -1)[token:token + 1]
    teacher = torch.log_softmax(logits / teacher_temperature(rollout_temperature), -1)[token:token + 1]
    close(student, [math.log(0.9)])
    close(opd_reverse_kl(student, teacher, torch.tensor([1])), [0.0])
    at_one = torch.log_softmax(logits, -1)[token:token + 1]
    close(opd_reverse_kl(student, at_one, torch.tensor([1])), [math.log(1.2)])
