"""The rollout section: prompts, sampling, generate hooks, rewards, evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from actors.rollout.hooks import check_hook, is_native_filter, load_function, split_function_path
from policies.rewards import BUILTIN_REWARDS
from policies.sampling_filters import BUILTIN_FILTERS
from slime_async.config.paths import require_file
from slime_async.config.flags import JsonDict
from slime_async.config.flags import field_help as _help

HOOK = "pkg.mod:fn or pkg.mod.fn — "
REASONING_GYM = "reasoning_gym"  # --rm-type of reasoning-gym's own scorers (actors/rollout/reasoning_gym.py)


@dataclass
class RolloutConfig:
    # --- data
    prompt_data: str | None = field(default=None, metadata=_help("training prompts: a .jsonl or .parquet file"))
    input_key: str = field(default="prompt", metadata=_help("row key of the prompt (text or chat messages)"))
    label_key: str = field(default="label", metadata=_help("row key of the reference answer"))
    metadata_key: str = field(default="metadata", metadata=_help("row key of per-prompt metadata"))
    apply_chat_template: bool = field(default=False, metadata=_help("render prompts with the tokenizer's chat template"))
    apply_chat_template_kwargs: JsonDict = field(default_factory=dict, metadata=_help(
        "JSON object of extra keyword arguments for apply_chat_template, e.g. '{\"enable_thinking\": false}'"))
    rollout_shuffle: bool = field(default=True, metadata=_help("shuffle prompts every epoch"))
    rollout_seed: int = field(default=42, metadata=_help("seed of the prompt order (each epoch's shuffle); sampling is not seeded by it"))
    num_epoch: int = field(default=1, metadata=_help("passes over the prompt data; the run ends when they are used up, before --num-rollout steps if need be"))
    num_rollout: int | None = field(default=None, metadata=_help("number of training steps (unset: the steps --num-epoch passes over the data make)"))
    # --- groups and sampling
    rollout_batch_size: int = field(default=8, metadata=_help("prompts (groups) per training step"))
    n_samples_per_prompt: int = field(default=4, metadata=_help("samples per prompt; they form a group"))
    over_sampling_batch_size: int | None = field(default=None, metadata=_help(
        "groups admitted per training step when a dynamic-sampling filter may drop some (>= --rollout-batch-size); "
        "surplus groups that outlive the staleness bound are dropped and counted"))
    rollout_max_response_len: int = field(default=64, metadata=_help("max new tokens per sample"))
    rollout_max_context_len: int | None = field(default=None, metadata=_help(
        "max prompt + response tokens: longer prompts are skipped at load (counted as bad rows) and each "
        "sample's new tokens are capped to what is left; multi-turn hooks read it to cap their turns"))
    rollout_temperature: float = field(default=1.0, metadata=_help("sampling temperature"))
    rollout_top_p: float = field(default=1.0, metadata=_help("nucleus sampling"))
    rollout_top_k: int = field(default=-1, metadata=_help("top-k sampling; -1 = off"))
    rollout_stop_token_ids: list[int] | None = field(default=None, metadata=_help("extra stop token ids"))
    rollout_concurrency: int | None = field(default=None, metadata=_help(
        "max generations in flight; unset: twice what the engines hold at once (so that they stay full "
        "while groups finish their last samples and are scored), summed over the engines the router can "
        "send to (each 2 x min(max_running_requests, max_total_num_tokens // (mean prompt tokens + "
        "--rollout-max-response-len)) from its /server_info; 64 for one that reports neither), "
        "following engines that join or leave; set: a cap on that"))
    use_rollout_routing_replay: bool = field(default=False, metadata=_help(
        "rollout routing replay (R3, slime's flag; MoE models): every request asks the engines for the experts "
        "each MoE layer used at every position (engines the run starts get SGLang's --enable-return-routed-experts), "
        "and each sample carries them (rollout_routed_experts [len(tokens) - 1, MoE layers, top-k]) for the trainer "
        "to route with instead of its own top-k"))
    # --- hooks
    custom_generate_function_path: str | None = field(default=None, metadata=_help(
        HOOK + "async def generate(ctx, sample, sampling_params) -> Sample | list[Sample]; slime's "
        "generate(args, sample, sampling_params) runs too"))
    rollout_function_path: str | None = field(default=None, metadata=_help(
        HOOK + "async def rollout_group(ctx, samples, sampling_params) -> list[Sample]: replaces "
        "the whole group generation (the generate hook then is not used); also with args for ctx"))
    custom_rm_path: str | None = field(default=None, metadata=_help(
        HOOK + "async def rm(ctx, sample) -> float (with --group-rm: rm(ctx, samples) -> list[float]); "
        "slime's rm(args, sample) runs too"))
    rm_type: str = field(default="math", metadata=_help(
        "built-in reward when --custom-rm-path is unset: math, exact, f1, reasoning_gym (the task's own scorer "
        "on rows written by slime-async prepare-reasoning-gym), or none (0 for every sample, rows need no label: "
        "pure on-policy distillation with --use-opd)"))
    group_rm: bool = field(default=False, metadata=_help("the custom reward function scores a whole group at once"))
    reward_timeout: float = field(default=30.0, metadata=_help("seconds before a reward call counts as failed"))
    on_reward_error: Literal["zero", "drop"] = field(default="zero", metadata=_help(
        "a sample whose reward raised or timed out: reward 0, or drop its group"))
    reward_key: str | None = field(default=None, metadata=_help(
        "when the reward function returns a dict, the key of the reward to train on (the whole dict is "
        "kept in the sample's metadata as reward_info)"))
    dynamic_sampling_filter_path: str | None = field(default=None, metadata=_help(
        "pkg.mod:fn(rewards) -> bool (keep the group?), slime's fn(args, samples) -> DynamicFilterOutput | bool, "
        "or a built-in: nonuniform"))
    custom_config_path: str | None = field(default=None, metadata=_help(
        "YAML mapping of extra settings for slime-style plug-ins: each key becomes an attribute of their args"))
    # --- evaluation
    eval_prompt_data: list[str] | None = field(default=None, metadata=_help(
        "held-out prompts (.jsonl/.parquet): PATH (metrics eval/*) or NAME PATH [NAME PATH ...] (eval/<NAME>/*)"))
    eval_interval: int | None = field(default=None, metadata=_help("evaluate every N training steps (and at 0 and the end)"))
    n_samples_per_eval_prompt: int = field(default=1, metadata=_help("samples per eval prompt"))
    eval_temperature: float = field(default=0.0, metadata=_help("eval sampling temperature; 0 = greedy"))
    eval_max_response_len: int | None = field(default=None, metadata=_help("defaults to --rollout-max-response-len"))

    @property
    def logprob_temperature(self) -> float:
        """The temperature the trainer's logprobs use: the sampling one, so that they match the
        engine's; 1 for greedy sampling (0), whose logprobs are those of the plain softmax."""
        return self.rollout_temperature or 1.0

    def validate(self) -> None:
        positive = ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len", "rollout_concurrency",
                    "num_epoch", "n_samples_per_eval_prompt")
        for name in positive:
            if getattr(self, name) is not None and getattr(self, name) <= 0:
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
            if path is not None:
                try:
                    split_function_path(path)
                except ValueError as error:
                    raise ValueError(f"--{name.replace('_', '-')}: {error}") from None
        if self.group_rm and not self.custom_rm_path:
            raise ValueError("--group-rm needs --custom-rm-path")
        if not self.custom_rm_path and self.rm_type not in (*BUILTIN_REWARDS, REASONING_GYM):
            raise ValueError(f"--rm-type {self.rm_type!r} is not a built-in reward: choose one of "
                             f"{', '.join((*BUILTIN_REWARDS, REASONING_GYM))}, or give --custom-rm-path")
        if self.reward_timeout <= 0:
            raise ValueError(f"--reward-timeout must be > 0, got {self.reward_timeout:g}")
        if self.eval_max_response_len is not None and self.eval_max_response_len <= 0:
            raise ValueError(f"--eval-max-response-len must be > 0, got {self.eval_max_response_len}")
        self.eval_sets()  # NAME PATH pairs
        if self.rollout_max_context_len is not None and self.rollout_max_context_len < 2:
            raise ValueError(f"--rollout-max-context-len must be >= 2 (a prompt token and a new one), "
                             f"got {self.rollout_max_context_len}")
        self.plugin_settings()  # the file exists and is a mapping

    def preflight(self) -> None:
        """What lies outside the config, checked once at start before anything is spawned: the
        data files exist, every hook imports and takes the arguments it will be called with."""
        if self.prompt_data:
            _require_prompt_file(self.prompt_data, "--prompt-data")
        for path in self.eval_sets().values():
            _require_prompt_file(path, "--eval-prompt-data")
        if not self.custom_rm_path and self.rm_type == REASONING_GYM:
            from actors.rollout.reasoning_gym import require_package

            try:
                require_package()
            except ValueError as error:
                raise ValueError(f"--rm-type reasoning_gym: {error}") from None
        from actors.rollout import verifiers_env

        if verifiers_env.uses_hooks(self):
            try:
                verifiers_env.preflight(self)
            except ValueError as error:
                raise ValueError(f"--custom-config-path (verifiers hooks): {error}") from None
        if self.custom_generate_function_path:
            check_hook(self.custom_generate_function_path, "--custom-generate-function-path", (3,),
                       "generate(ctx, sample, sampling_params)")
        if self.rollout_function_path:
            function = check_hook(self.rollout_function_path, "--rollout-function-path", (3,),
                                  "rollout_group(ctx, samples, sampling_params)")
            from actors.rollout.slime_plugins import SlimePlugins  # imports this module

            SlimePlugins(self, None).group(function)  # refuses slime's whole-rollout generate_rollout
        if self.custom_rm_path:
            check_hook(self.custom_rm_path, "--custom-rm-path", (2,),
                       "rm(ctx, samples)" if self.group_rm else "rm(ctx, sample)")
        path = self.dynamic_sampling_filter_path
        if path and path not in BUILTIN_FILTERS:
            # Called as fn(rewards) or, slime-style (first parameter `args`), as fn(args, samples).
            native = is_native_filter(load_function(path, "--dynamic-sampling-filter-path"))
            check_hook(path, "--dynamic-sampling-filter-path", (1,) if native else (2,),
                       "fn(rewards)" if native else "fn(args, samples)")

    def eval_sets(self) -> dict[str, str]:
        """``{name: path}`` of --eval-prompt-data: one PATH is the unnamed set "" (metrics
        eval/*), NAME PATH pairs are named sets (metrics eval/<NAME>/*)."""
        values = list(self.eval_prompt_data or [])
        if len(values) == 1:
            return {"": values[0]}
        if len(values) % 2:
            raise ValueError(f"--eval-prompt-data takes PATH or NAME PATH [NAME PATH ...], got {len(values)} values: "
                             f"{' '.join(values)}")
        pairs = {}
        for name, path in zip(values[::2], values[1::2]):
            if not name or "/" in name or name in pairs:
                raise ValueError(f"--eval-prompt-data: eval set name {name!r} must be unique, non-empty and "
                                 "without '/' (it becomes the metric prefix eval/<name>/)")
            pairs[name] = path
        return pairs

    def plugin_settings(self) -> dict[str, Any]:
        """The --custom-config-path mapping ({} without one)."""
        if not self.custom_config_path:
            return {}
        path = require_file(self.custom_config_path, "--custom-config-path")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as error:
            raise ValueError(f"--custom-config-path {path}: not YAML: {str(error).splitlines()[0]}") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
            raise ValueError(f"--custom-config-path {path}: expected a mapping of names to values")
        return data


def _require_prompt_file(path: str, flag: str) -> None:
    """``path`` is a readable file in a format the prompt loader reads (by its suffix, as the loader tells)."""
    from actors.rollout.data import JSONL_SUFFIXES, PARQUET_SUFFIXES  # here: data.py imports this module

    suffix = require_file(path, flag).suffix.lower()
    if suffix not in JSONL_SUFFIXES + PARQUET_SUFFIXES:
        raise ValueError(f"{flag} {path}: unsupported format {repr(suffix) if suffix else '(no suffix)'} "
                         "(a .jsonl or .parquet file)")
