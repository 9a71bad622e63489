"""Per-token estimators of KL(π || q) from the log-probabilities of the sampled tokens.

Schulman's estimators (http://joschu.net/blog/kl-approx.html), with tokens sampled from π:
    log_ratio = log π − log q
    k1         = log_ratio                              (unbiased, high variance, can be < 0)
    k2         = ½ · log_ratio²                         (biased, >= 0)
    k3         = exp(−log_ratio) − (−log_ratio) − 1     (unbiased, >= 0)
    low_var_kl = clamp(k3, −10, 10)                      (k3 guarded against exp overflow)
"""

from __future__ import annotations

import torch

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")

# Bound of low_var_kl: a single token whose ratio exploded must not dominate the loss.
LOW_VAR_KL_BOUND = 10.0


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy (logprobs) and a reference (ref_logprobs).

    Shapes are equal and arbitrary; the result has the same shape and is computed in float32
    (bf16 log-ratios lose the small differences the estimate is made of). Masking is the
    caller's job.
    """
    log_ratio = logprobs.float() - ref_logprobs.float()
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind in ("k3", "low_var_kl"):
        neg = -log_ratio
        k3 = neg.exp() - neg - 1.0
        if kind == "low_var_kl":
            return k3.clamp(-LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)
        return k3
    raise ValueError(f"kl kind {kind!r} is not one of {list(KL_KINDS)}")
