"""The rollout section: prompts, sampling, generate hooks, rewards, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help


@dataclass
class RolloutConfig:
    # --- data
    prompt_data: str | None = field(default=None, metadata=_help("training prompts: a .jsonl or .parquet file"))
    input_key: str = field(default="prompt", metadata=_help("row key of the prompt (text or chat messages)"))
    label_key: str = field(default="label", metadata=_help("row key of the reference answer"))
    metadata_key: str = field(default="metadata", metadata=_help("row key of per-prompt metadata"))
    apply_chat_template: bool = field(default=False, metadata=_help("render prompts with the tokenizer's chat template"))
    rollout_shuffle: bool = field(default=True, metadata=_help("shuffle prompts every epoch"))
    rollout_seed: int = field(default=42, metadata=_help("seed of the prompt order and of sampling"))
    num_epoch: int = field(default=1, metadata=_help("passes over the prompt data (when --num-rollout is unset)"))
    num_rollout: int | None = field(default=None, metadata=_help("number of training steps; overrides --num-epoch"))
    # --- groups and sampling
    rollout_batch_size: int = field(default=8, metadata=_help("prompts (groups) per training step"))
    n_samples_per_prompt: int = field(default=4, metadata=_help("samples per prompt; they form a group"))
    over_sampling_batch_size: int | None = field(default=None, metadata=_help(
        "groups admitted per policy version when a dynamic-sampling filter may drop some (>= --rollout-batch-size); "
        "surplus groups that outlive the staleness bound are dropped and counted"))
    rollout_max_response_len: int = field(default=64, metadata=_help("max new tokens per sample"))
    rollout_temperature: float = field(default=1.0, metadata=_help("sampling temperature"))
    rollout_top_p: float = field(default=1.0, metadata=_help("nucleus sampling"))
    rollout_top_k: int = field(default=-1, metadata=_help("top-k sampling; -1 = off"))
    rollout_stop_token_ids: list[int] | None = field(default=None, metadata=_help("extra stop token ids"))
    rollout_concurrency: int = field(default=64, metadata=_help("max generations in flight"))
    # --- hooks
    custom_generate_function_path: str | None = field(default=None, metadata=_help(
        "pkg.mod:fn — async def generate(ctx, sample, sampling_params) -> Sample | list[Sample]"))
    rollout_function_path: str | None = field(default=None, metadata=_help(
        "pkg.mod:fn — async def rollout_group(ctx, samples, sampling_params) -> list[Sample]: replaces "
        "the whole group generation (the generate hook then is not used)"))
    custom_rm_path: str | None = field(default=None, metadata=_help(
        "pkg.mod:fn — async def rm(ctx, sample) -> float (with --group-rm: rm(ctx, samples) -> list[float])"))
    rm_type: str = field(default="math", metadata=_help("built-in reward when --custom-rm-path is unset: math, exact, f1"))
    group_rm: bool = field(default=False, metadata=_help("the custom reward function scores a whole group at once"))
    reward_timeout: float = field(default=30.0, metadata=_help("seconds before a reward call counts as failed"))
    on_reward_error: Literal["zero", "drop"] = field(default="zero", metadata=_help(
        "a sample whose reward raised or timed out: reward 0, or drop its group"))
    dynamic_sampling_filter_path: str | None = field(default=None, metadata=_help(
        "pkg.mod:fn(rewards) -> bool (keep the group?), or a built-in: nonuniform"))
    # --- evaluation
    eval_prompt_data: str | None = field(default=None, metadata=_help("held-out prompts (.jsonl/.parquet)"))
    eval_interval: int | None = field(default=None, metadata=_help("evaluate every N training steps (and at 0 and the end)"))
    eval_n_samples: int = field(default=1, metadata=_help("samples per eval prompt"))
    eval_temperature: float = field(default=0.0, metadata=_help("eval sampling temperature; 0 = greedy"))
    eval_max_response_len: int | None = field(default=None, metadata=_help("defaults to --rollout-max-response-len"))

    def validate(self) -> None:
        positive = ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len", "rollout_concurrency",
                    "num_epoch", "eval_n_samples")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        if self.num_rollout is not None and self.num_rollout <= 0:
            raise ValueError(f"--num-rollout must be > 0, got {self.num_rollout}")
        if self.over_sampling_batch_size is not None and self.over_sampling_batch_size < self.rollout_batch_size:
            raise ValueError(
                f"--over-sampling-batch-size ({self.over_sampling_batch_size}) must be >= "
                f"--rollout-batch-size ({self.rollout_batch_size})")
        if self.rollout_temperature < 0 or self.eval_temperature < 0:
            raise ValueError("--rollout-temperature and --eval-temperature must be >= 0")
        if not 0 < self.rollout_top_p <= 1:
            raise ValueError(f"--rollout-top-p must be in (0, 1], got {self.rollout_top_p}")
        if self.eval_interval is not None and not self.eval_prompt_data:
            raise ValueError("--eval-interval needs --eval-prompt-data")
        for name in ("custom_generate_function_path", "rollout_function_path", "custom_rm_path"):
            path = getattr(self, name)
            if path is not None and ":" not in path:
                raise ValueError(f"--{name.replace('_', '-')} must look like package.module:function, got {path!r}")
        if self.group_rm and not self.custom_rm_path:
            raise ValueError("--group-rm needs --custom-rm-path")
