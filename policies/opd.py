"""On-policy distillation (OPD): the teacher's per-token log-probabilities as a learning signal.

The student samples a response; a teacher scores the same tokens. The per-token reverse KL
estimate (k1 with tokens drawn from the student)

    reverse_kl_t = log π_student(y_t) − log π_teacher(y_t)

is subtracted, times `opd_kl_coef`, from every response token's advantage, whatever estimator
produced it (GRPO, PPO with a critic, REINFORCE++, or all-zero advantages for pure
distillation without rewards). This follows slime's `apply_opd_kl_to_advantages`
(slime/backends/megatron_utils/loss.py), which, like us, uses the student log-probabilities
recomputed by the trainer before the update (π_old), not the engine's rollout logprobs (μ).

Unlike slime we zero the term on tokens the model did not generate (loss_mask 0: tool output,
user turns of a multi-turn sample), so neither the advantages nor the logged KL see them.

Both log-probabilities are at one temperature, the student's (``teacher_temperature``), as in
slime: its Megatron teacher goes through the student's logprob function, which divides the logits
by --rollout-temperature, and its SGLang teacher is asked for that temperature (slime#2325 makes it
take effect; SGLang 0.5.17 ignores it for the given tokens, see ENGINE_TEACHER_TEMPERATURE).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# SGLang 0.5.17 scores given tokens (/generate's input_token_logprobs) with the log-softmax of the
# raw logits whatever sampling_params.temperature says (its logits processor normalises input
# logprobs "w/o temperature"; slime#2319 measured it): an engine teacher answers at temperature 1.
ENGINE_TEACHER_TEMPERATURE = 1.0


def teacher_temperature(student_temperature: float) -> float:
    """The temperature of the teacher's logprobs in the OPD term: the student's.

    The student's logprobs (π_old, or μ) are of its sampling distribution p_T (logits / T, T
    the rollout's logprob temperature), which drew the tokens. Scored at the same T, the k1 term
    log p_T(y) − log q_T(y) estimates KL(p_T || q_T) without bias: 0 where the student is the
    teacher, smallest only there. A teacher at temperature 1 instead would pull p_T towards q_1,
    leaving the student's own distribution the teacher's at temperature 1/T (flatter for T < 1),
    with a "reverse KL" that is not 0 even for a student equal to its teacher.
    """
    return student_temperature


def opd_reverse_kl(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
                   loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token log π_student − log π_teacher in float32, 0 where loss_mask is 0.

    All three tensors have one shape (one sample's response tokens, or a padded batch).
    """
    if student_logprobs.shape != teacher_logprobs.shape or student_logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"opd: student logprobs {tuple(student_logprobs.shape)}, teacher logprobs "
            f"{tuple(teacher_logprobs.shape)} and loss_mask {tuple(loss_mask.shape)} must have one shape")
    diff = student_logprobs.float() - teacher_logprobs.float()
    return torch.where(loss_mask.bool(), diff, torch.zeros_like(diff))


def apply_opd(advantages: torch.Tensor, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor,
              loss_mask: torch.Tensor, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (advantages − kl_coef · reverse_kl, reverse_kl); the input is not modified."""
    reverse_kl = opd_reverse_kl(student_logprobs, teacher_logprobs, loss_mask)
    return advantages.float() - kl_coef * reverse_kl, reverse_kl


def teacher_response_logprobs(input_token_logprobs: Sequence[Sequence], response_length: int) -> list[float]:
    """The teacher's logprobs of a sample's last `response_length` tokens from an SGLang reply.

    SGLang's `/generate` with `max_new_tokens: 0`, `return_logprob: true` and
    `logprob_start_len: 0` returns `meta_info.input_token_logprobs` as one
    `[logprob, token_id, text_or_null]` per input token, the first with logprob null (no
    context predicts it). The response is the tail of the input, so its scores are the tail of
    the list; a prompt shorter than one token is impossible, so the null never lands in it.
    """
    if response_length < 0:
        raise ValueError(f"opd: response_length {response_length} is negative")
    if response_length == 0:
        return []
    if response_length > len(input_token_logprobs) - 1:
        raise ValueError(
            f"opd: teacher scored {len(input_token_logprobs)} input tokens, too few for a response of "
            f"{response_length} after at least one prompt token")
    tail = input_token_logprobs[-response_length:]
    out = []
    for position, entry in enumerate(tail):
        if entry[0] is None:
            raise ValueError(f"opd: teacher logprob of response token {position} is null")
        out.append(float(entry[0]))
    return out


def opd_metrics(reverse_kl: torch.Tensor, loss_mask: torch.Tensor, scored_mask: torch.Tensor) -> dict[str, float]:
    """`train/opd_reverse_kl` (mean over model tokens) and the fraction of model tokens scored.

    scored_mask is 1 where a teacher logprob was available (a sample the teacher could not
    score, e.g. after its engine failed, contributes zeros to the mask).
    """
    model_tokens = loss_mask.bool()
    n = int(model_tokens.sum())
    if n == 0:
        return {"train/opd_reverse_kl": 0.0, "train/opd_scored_fraction": 0.0}
    scored = (scored_mask.bool() & model_tokens)
    mean_kl = float(reverse_kl.float()[scored].sum()) / max(int(scored.sum()), 1)
    return {"train/opd_reverse_kl": mean_kl, "train/opd_scored_fraction": int(scored.sum()) / n}
