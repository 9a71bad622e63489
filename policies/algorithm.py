"""`AlgorithmConfig`: every algorithm knob of the training objective, named after slime's flags.

The trainer worker builds one `AlgorithmConfig` from the algorithm section of the config and passes it
to `policies.objective.compute_objective` for every micro-batch. Field names are slime's flag
names with dashes turned into underscores (`--eps-clip-high` -> `eps_clip_high`), so a slime
recipe translates one to one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

LOSS_TYPES = ("policy_loss", "sft")
ADVANTAGE_ESTIMATORS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "gspo",
    "ppo",  # GAE over a learned critic's values (policies.gae); the critic trains alongside
)
POLICY_LOSSES = ("ppo", "cispo", "gspo")
KL_LOSS_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
MIS_LEVELS = (None, "sequence", "geometric")
MIS_MODES = ("truncate", "clip", "mask")


@dataclass(frozen=True)
class AlgorithmConfig:
    """Algorithm knobs of the RL objective (defaults = vanilla GRPO with PPO clipping).

    Policy loss
        loss_type: "policy_loss" (RL) or "sft" (negative log-likelihood on masked tokens).
        advantage_estimator: how rewards become advantages (see `policies.advantages`).
        policy_loss: "ppo" (clipped surrogate), "cispo" (clipped-IS-weight REINFORCE) or
            "gspo" (sequence-level ratio).
        eps_clip: lower clip range, the ratio is kept >= 1 - eps_clip.
        eps_clip_high: upper clip range (DAPO clip-higher); None means eps_clip.
        eps_clip_c: dual-clip constant (> 1) bounding the loss of negative-advantage tokens;
            None disables dual clip.
        loss_agg: how per-token losses become one number (see `policies.losses.aggregate`).

    Regularisers
        use_kl_loss / kl_loss_coef / kl_loss_type: KL(π_θ || π_ref) penalty added to the loss
            (with kl_loss_coef 0 it is only measured and logged).
        entropy_coef: weight of the entropy bonus (subtracted from the loss).

    Train-inference mismatch (μ = rollout engine, π_old = trainer recompute)
        use_tis / tis_clip / tis_clip_low: token-level truncated IS weight
            clamp(π_old/μ, tis_clip_low, tis_clip).
        use_icepop / icepop_low / icepop_high: weight tokens by π_old/μ inside
            [icepop_low, icepop_high] and drop those outside (defaults 0.5 / 5.0 as in the
            IcePop write-up; slime's icepop does the same with its TIS bounds).
        mis_level / mis_mode / mis_threshold_low / mis_threshold_high: sequence-level IS
            weight (product "sequence" or geometric mean "geometric" of token ratios), either
            truncated above, clipped to both bounds or masked outside them. None disables.
        use_rollout_logprobs: π_old := μ, the engine's logprobs (slime's flag): the PPO ratio
            is π_θ/μ and the trainer recomputes nothing; excludes the π_old/μ corrections.
        use_decoupled_ppo / decoupled_behave_cap: AReaL's decoupled PPO: clip against the
            proximal policy π_old (the trainer's recompute) and weight by π_old/μ; tokens
            whose weight exceeds the cap are dropped (None = no cap).

    Advantages
        kl_coef: weight of the per-token KL(π_old || π_ref) reward penalty of the REINFORCE++
            estimators (slime's --kl-coef; unrelated to kl_loss_coef).
        gamma: discount of REINFORCE++ returns and of PPO's GAE.
        normalize_advantages: whiten scalar-estimator advantages over all masked tokens of the
            batch (REINFORCE++ variants are always whitened).

    On-policy distillation (slime's flags; policies.opd)
        use_opd / opd_type / opd_kl_coef: subtract opd_kl_coef · (log π_old − log π_teacher) from
            every model token's advantage, after the estimator; the teacher is an engine that
            scores the rollout ("sglang") or a frozen model in the trainer ranks ("megatron").
    """

    loss_type: Literal["policy_loss", "sft"] = field(default="policy_loss", metadata={"help": 'policy_loss (RL) or sft (negative log-likelihood of the response)'})
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gspo", "ppo"] = field(default="grpo", metadata={"help": 'how rewards become advantages (ppo: GAE over a critic)'})
    policy_loss: Literal["ppo", "cispo", "gspo"] = field(default="ppo", metadata={"help": 'ppo (clipped surrogate), cispo (clipped-IS REINFORCE) or gspo (sequence ratio)'})
    eps_clip: float = field(default=0.2, metadata={"help": 'PPO clip range: 1 - eps_clip <= ratio <= 1 + eps_clip (the upper: --eps-clip-high when set)'})
    eps_clip_high: float | None = field(default=None, metadata={"help": 'upper clip range (clip-higher); unset = --eps-clip'})
    eps_clip_c: float | None = field(default=None, metadata={"help": 'dual-clip constant (> 1) for negative advantages; unset = off'})
    use_kl_loss: bool = field(default=False, metadata={"help": 'add a KL(pi || pi_ref) loss against the frozen reference (--ref-load, else the initial weights)'})
    kl_loss_coef: float = field(default=0.0, metadata={"help": 'weight of the KL loss'})
    kl_loss_type: Literal["k1", "k2", "k3", "low_var_kl"] = field(default="low_var_kl", metadata={"help": 'KL estimator of the KL loss and of the --kl-coef penalty'})
    entropy_coef: float = field(default=0.0, metadata={"help": 'weight of the entropy bonus'})
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = field(default="token_mean", metadata={"help": 'how per-token losses are aggregated'})
    use_tis: bool = field(default=False, metadata={"help": 'token-level truncated importance sampling pi_old/mu (train-inference mismatch)'})
    tis_clip: float = field(default=2.0, metadata={"help": 'TIS upper clip'})
    tis_clip_low: float = field(default=0.0, metadata={"help": 'TIS lower clip'})
    use_icepop: bool = field(default=False, metadata={"help": 'weight tokens by pi_old/mu inside [icepop_low, icepop_high], drop those outside'})
    icepop_low: float = field(default=0.5, metadata={"help": 'ICE-POP lower bound'})
    icepop_high: float = field(default=5.0, metadata={"help": 'ICE-POP upper bound'})
    mis_level: str | None = field(default=None, metadata={"help": 'sequence-level IS weights: sequence (product) or geometric (mean); unset = off'})
    mis_mode: Literal["truncate", "clip", "mask"] = field(default="truncate", metadata={"help": 'how sequence IS weights are bounded'})
    mis_threshold_low: float = field(default=0.5, metadata={"help": 'MIS lower threshold'})
    mis_threshold_high: float = field(default=2.0, metadata={"help": 'MIS upper threshold'})
    use_rollout_logprobs: bool = field(default=False, metadata={"help": "use the engine's logprobs as pi_old (no recompute): ratio pi_theta/mu"})
    use_decoupled_ppo: bool = field(default=False, metadata={"help": 'AReaL decoupled PPO: clip against the proximal policy, weight by proximal/behaviour'})
    decoupled_behave_cap: float | None = field(default=None, metadata={"help": 'drop tokens whose proximal/behaviour weight exceeds this; unset = no cap'})
    kl_coef: float = field(default=0.0, metadata={"help": 'weight of a per-token KL-to-reference penalty in the reward (REINFORCE++ variants and ppo; the scalar estimators ignore it)'})
    gamma: float = field(default=1.0, metadata={"help": 'discount of REINFORCE++ returns and PPO GAE'})
    normalize_advantages: bool = field(default=False, metadata={"help": "whiten scalar advantages over the batch's trainable tokens (REINFORCE++ variants always are)"})
    use_opd: bool = field(default=False, metadata={"help": "on-policy distillation: a teacher's per-token logprobs of the student's samples become an advantage term (needs --opd-type)"})
    opd_type: Literal["sglang", "megatron"] | None = field(default=None, metadata={"help": "where the teacher runs: sglang (an engine: --opd-teacher-hf-checkpoint or --opd-teacher-url, scored during rollout) or megatron (frozen in the trainer ranks: --opd-teacher-load)"})
    opd_kl_coef: float = field(default=1.0, metadata={"help": "weight of the OPD reverse-KL term subtracted from the advantages"})

    @property
    def clip_high(self) -> float:
        """The effective upper clip range (eps_clip_high, or eps_clip when unset)."""
        return self.eps_clip if self.eps_clip_high is None else self.eps_clip_high

    def validate(self) -> "AlgorithmConfig":
        """Raise ValueError naming the offending field; return self so calls can chain."""
        _one_of("loss_type", self.loss_type, LOSS_TYPES)
        _one_of("advantage_estimator", self.advantage_estimator, ADVANTAGE_ESTIMATORS)
        _one_of("policy_loss", self.policy_loss, POLICY_LOSSES)
        _one_of("kl_loss_type", self.kl_loss_type, KL_LOSS_TYPES)
        _one_of("loss_agg", self.loss_agg, LOSS_AGGREGATIONS)
        _one_of("mis_level", self.mis_level, MIS_LEVELS)
        _one_of("mis_mode", self.mis_mode, MIS_MODES)
        if self.eps_clip < 0:
            raise ValueError(f"eps_clip must be >= 0, got {self.eps_clip}")
        if self.eps_clip_high is not None and self.eps_clip_high < 0:
            raise ValueError(f"eps_clip_high must be >= 0, got {self.eps_clip_high}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(
                f"eps_clip_c (dual-clip constant) must be > 1, got {self.eps_clip_c}"
            )
        if self.kl_loss_coef < 0:
            raise ValueError(f"kl_loss_coef must be >= 0, got {self.kl_loss_coef}")
        # use_kl_loss with kl_loss_coef 0 is allowed, as in slime (its recipes pass
        # --use-kl-loss --kl-loss-coef 0.0): the KL to the reference is computed and logged
        # (train/kl_loss) but adds nothing to the loss.
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0, got {self.entropy_coef}")
        if self.tis_clip_low < 0 or self.tis_clip < self.tis_clip_low:
            raise ValueError(
                f"tis_clip ({self.tis_clip}) must be >= tis_clip_low ({self.tis_clip_low}) >= 0"
            )
        if self.icepop_low < 0 or self.icepop_high < self.icepop_low:
            raise ValueError(
                f"icepop_high ({self.icepop_high}) must be >= icepop_low ({self.icepop_low}) >= 0"
            )
        if self.mis_threshold_low < 0 or self.mis_threshold_high < self.mis_threshold_low:
            raise ValueError(
                f"mis_threshold_high ({self.mis_threshold_high}) must be >= "
                f"mis_threshold_low ({self.mis_threshold_low}) >= 0"
            )
        if self.decoupled_behave_cap is not None and self.decoupled_behave_cap <= 0:
            raise ValueError(
                f"decoupled_behave_cap must be > 0 or None, got {self.decoupled_behave_cap}"
            )
        # Two corrections of the same π_old/μ ratio would apply it twice.
        if self.use_tis and self.mis_level is not None:
            raise ValueError("use_tis and mis_level both reweight π_old/μ; enable only one")
        if self.use_icepop and (self.use_tis or self.mis_level is not None):
            raise ValueError("use_icepop already weights by π_old/μ; disable use_tis and mis_level")
        if self.use_rollout_logprobs:
            # π_old = μ makes every π_old/μ weight 1 (slime refuses use_tis with it likewise).
            on = [name for name, value in (("use_tis", self.use_tis), ("use_icepop", self.use_icepop),
                                           ("mis_level", self.mis_level is not None),
                                           ("use_decoupled_ppo", self.use_decoupled_ppo)) if value]
            if on:
                raise ValueError(f"use_rollout_logprobs makes π_old = μ, so {', '.join(on)} would correct "
                                 "nothing; drop one of them")
        if self.use_decoupled_ppo and (self.use_tis or self.use_icepop or self.mis_level is not None):
            raise ValueError(
                "use_decoupled_ppo already weights by π_old/μ; disable use_tis, use_icepop and mis_level"
            )
        if self.use_decoupled_ppo and self.policy_loss != "ppo":
            raise ValueError(
                f"use_decoupled_ppo requires policy_loss='ppo', got {self.policy_loss!r}"
            )
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        self._check_opd()
        return self

    def _check_opd(self) -> None:
        if self.use_opd and self.opd_type is None:
            raise ValueError("--use-opd needs --opd-type sglang or megatron")
        if self.opd_type is not None and not self.use_opd:
            raise ValueError(f"--opd-type {self.opd_type} needs --use-opd")
        _one_of("opd_type", self.opd_type, (None, "sglang", "megatron"))
        if self.opd_kl_coef <= 0 or self.opd_kl_coef != self.opd_kl_coef:
            raise ValueError(f"--opd-kl-coef must be > 0, got {self.opd_kl_coef}")
        if self.use_opd and self.loss_type != "policy_loss":
            raise ValueError("--use-opd needs --loss-type policy_loss (its term goes into the advantages)")


def _one_of(field_name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{field_name}={value!r} is not one of {list(allowed)}")
