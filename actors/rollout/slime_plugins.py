"""Running hooks written against slime's signatures (the adapter half of the slime compat layer).

``slime_async.compat.slime`` gives plug-ins slime's import paths and types; this module, which
may use components, turns each slime-style hook into the native signature the rollout calls:

- ``generate(args, sample, sampling_params[, evaluation=...])``: gets slime's ``args``, the
  prompt as text (chat template applied when ``--apply-chat-template``), and slime's request
  defaults (``no_stop_trim``, ``skip_special_tokens`` off); it talks to the router's HTTP front
  at ``args.sglang_router_ip:args.sglang_router_port``. A sample it returns ``ABORTED`` (a weight
  update cut its request) is generated again from the prompt: slime-style hooks own their
  loop, so partial rollout cannot resume them (``args.partial_rollout`` is False). What it
  returns is checked: ids filled in, per-token policy versions completed, logprobs required.
- ``rm(args, sample)`` / ``rm(args, samples)`` (``--group-rm``): called with ``args``.
- dynamic filters ``fn(args, samples)`` returning ``DynamicFilterOutput`` or a bool.
- ``--rollout-function-path fn(args, samples, sampling_params)`` (a group at a time). slime's own
  ``generate_rollout(args, rollout_id, data_source, evaluation)`` is refused: it owns the data
  source, filtering and aborts, which here belong to the rollout actor and the buffer.

``args`` is built once, at the first hook call (the front's URL is known by then), from the
whole run config the composition root hands over (or the rollout section alone), plus the names
slime derives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from actors.rollout.config import RolloutConfig
from actors.rollout.data import render_prompt
from actors.rollout.generate import GenerationFailed
from actors.rollout.hooks import hook_style, is_native_filter, parameter_names
from policies.rewards import BUILTIN_REWARDS
from slime_async.compat.slime.args import SlimeArgs
from slime_async.compat.slime.rollout.filter_hub.base_types import as_filter_output
from slime_async.compat.slime.services import CompatServices
from slime_async.compat.slime.utils.http_utils import ROUTER_AUTH
from slime_async.sample import Sample, Status, policy_version

log = logging.getLogger(__name__)

MAX_ABORT_RESTARTS = 8  # a slime-style sample aborted this often fails its group (which is retried)

GroupFilter = Callable[[list[Sample]], tuple[bool, str | None]]

# slime names with no setting of their own here, and the value that describes this runtime.
_SLIME_FIXED: dict[str, Any] = {
    "partial_rollout": False,  # slime-style hooks are never handed a half-generated sample
    "rollout_stop": None,
    "rollout_skip_special_tokens": False,
    "rollout_global_dataset": True,
    "ci_test": False,
    "use_rollout_routing_replay": False,
    "sglang_enable_deterministic_inference": False,
    "router_policy": None,
    "rm_url": None,
    "eval_reward_key": None,
    "multimodal_keys": None,
    "use_distributed_post": False,
    "context_parallel_size": 1,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "sglang_dp_size": None,
}


def slime_settings(config: RolloutConfig, run_settings: Mapping[str, Any] | None, *, tokenizer: Any,
                   concurrency: int | None = None) -> dict[str, Any]:
    """slime's ``args`` values: the run's settings (or the rollout section's), slime's derived
    names, then --custom-config-path's entries, which win as in slime. ``concurrency``: the
    rollout's current limit of generations in flight (slime's sglang_server_concurrency)."""
    values: dict[str, Any] = dict(run_settings) if run_settings is not None else {
        f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    for name, value in _SLIME_FIXED.items():
        values.setdefault(name, value)
    values.setdefault("hf_checkpoint", getattr(tokenizer, "name_or_path", None))
    # The limit the rollout derived from the engines when args was built (its first hook call);
    # without one, the explicit cap or slime's own default.
    values.setdefault("sglang_server_concurrency", concurrency or config.rollout_concurrency or 512)
    values.setdefault("eval_max_context_len", config.rollout_max_context_len)
    values.setdefault("eval_prompt_data", config.eval_prompt_data)
    values.update(config.plugin_settings())
    return values


def _router_address(router_url: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    if not router_url:
        reason = "this run has no router HTTP front (the rollout's GenerateContext has no router_url)"
        return {}, {"sglang_router_ip": reason, "sglang_router_port": reason}
    parts = urlsplit(router_url)
    return {"sglang_router_ip": parts.hostname, "sglang_router_port": parts.port}, {}


def builtin_reward(rm_type: str, response: str, label: Any) -> float:
    """A built-in rule reward by slime's rm_type name (this runtime's set)."""
    if rm_type not in BUILTIN_REWARDS:
        raise ValueError(f"rm_type {rm_type!r} is not a built-in reward here (choose {', '.join(BUILTIN_REWARDS)})")
    return BUILTIN_REWARDS[rm_type](response, label)


class SlimePlugins:
    """Wraps slime-style hooks into native ones; native hooks pass through unchanged."""

    def __init__(self, config: RolloutConfig, ctx: Any, run_settings: Mapping[str, Any] | None = None,
                 concurrency: Callable[[], int] | None = None):
        """``concurrency`` reads the rollout's current limit of generations in flight."""
        self.config = config
        self.ctx = ctx
        self._run_settings = run_settings
        self._concurrency = concurrency
        self._args: SlimeArgs | None = None

    @property
    def args(self) -> SlimeArgs:
        if self._args is None:
            values = slime_settings(self.config, self._run_settings, tokenizer=self.ctx.tokenizer,
                                    concurrency=self._concurrency() if self._concurrency else None)
            address, unavailable = _router_address(getattr(self.ctx, "router_url", None))
            values.update(address)
            services = CompatServices(tokenizer=self.ctx.tokenizer, builtin_reward=builtin_reward)
            missing = ("slime-async has no such setting" if self._run_settings is not None else
                       "not among the rollout section's settings (this rollout was not given the whole run config)")
            self._args = SlimeArgs(values, unavailable=unavailable, services=services, missing=missing)
        return self._args

    def _authorize_router_posts(self) -> None:
        # Set in the sample's own task, so it holds for every post() the hook makes from it.
        key, url = getattr(self.ctx, "router_api_key", None), getattr(self.ctx, "router_url", None)
        if key and url:
            ROUTER_AUTH.set((url.rstrip("/"), f"Bearer {key}"))

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The native request defaults plus slime's (stop text kept, special tokens in the text)."""
        return {**params, "no_stop_trim": True, "skip_special_tokens": False, "spaces_between_special_tokens": False}

    # ----- generate ------------------------------------------------------------------------------
    def generate(self, fn: Callable[..., Any]) -> Callable[..., Awaitable[Sample | list[Sample]]]:
        if hook_style(fn) == "native":
            return fn
        takes_evaluation = _accepts(fn, "evaluation")

        async def slime_generate(ctx: Any, sample: Sample, sampling_params: dict[str, Any],
                                 evaluation: bool = False) -> Sample | list[Sample]:
            self._as_slime_prompt(sample)
            self._authorize_router_posts()
            prompt_tokens = list(sample.prompt_tokens)
            extra = {"evaluation": evaluation} if takes_evaluation else {}
            for _ in range(MAX_ABORT_RESTARTS):
                result = await _resolve(fn(self.args, sample, self.sampling_params(sampling_params), **extra))
                produced = _as_list(result, "generate")
                if not any(s.status is Status.ABORTED for s in produced):
                    for out in produced:
                        self._complete(out, sample)
                    return result
                # A weight update aborted a request: slime would regenerate the sample, so do we.
                restarts = sample.metadata.get("restarts_after_abort", 0) + 1
                _restart(sample, prompt_tokens)
                sample.metadata["restarts_after_abort"] = restarts
            raise GenerationFailed(f"sample {sample.group_index}/{sample.index}: the slime-style generate returned "
                                   f"ABORTED {MAX_ABORT_RESTARTS} times")

        return slime_generate

    def group(self, fn: Callable[..., Any],
              flag: str = "--rollout-function-path") -> Callable[..., Awaitable[list[Sample]]]:
        names = parameter_names(fn)
        if "rollout_id" in names or "data_source" in names:
            raise ValueError(
                f"{flag}: {fn.__module__}.{fn.__name__}{inspect.signature(fn)} is slime's generate_rollout, which "
                "drives the whole rollout (data source, filtering, aborts); here the rollout actor owns those "
                "(staleness admission, checkpoints of prompts in flight). Port its per-sample part to "
                "--custom-generate-function-path generate(args, sample, sampling_params) or its per-group part "
                "to fn(args, samples, sampling_params) -> list[Sample]")
        if hook_style(fn) == "native":
            return fn

        async def slime_group(ctx: Any, samples: list[Sample], sampling_params: dict[str, Any]) -> list[Sample]:
            for sample in samples:
                self._as_slime_prompt(sample)
            self._authorize_router_posts()
            result = await _resolve(fn(self.args, samples, self.sampling_params(sampling_params)))
            produced = [s for item in _as_list(result, "rollout function") for s in _as_list(item, "rollout function")]
            for out in produced:
                self._complete(out, samples[0])
            return produced

        return slime_group

    # ----- rewards and filters ---------------------------------------------------------------------
    def reward(self, fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
        """``rm(ctx, sample | samples)`` for either style; slime's may be sync, and may return a
        dict (``--reward-key`` picks the value)."""
        if hook_style(fn) == "native":
            return fn

        async def slime_rm(ctx: Any, sample_or_samples: Any) -> Any:
            if inspect.iscoroutinefunction(fn):
                return await fn(self.args, sample_or_samples)
            # A sync reward runs in a thread, as the built-ins do: on the event loop it would stall
            # every actor and --reward-timeout could not interrupt it.
            return await _resolve(await asyncio.to_thread(fn, self.args, sample_or_samples))

        return slime_rm

    def group_filter(self, fn: Callable[..., Any]) -> GroupFilter:
        """``keep(samples) -> (keep, reason)`` for a native ``fn(rewards) -> bool`` or slime's
        ``fn(args, samples) -> DynamicFilterOutput | bool``."""
        if is_native_filter(fn):
            return lambda samples: (bool(fn([s.reward for s in samples])), None)

        def slime_filter(samples: list[Sample]) -> tuple[bool, str | None]:
            output = as_filter_output(fn(self.args, samples))
            return bool(output.keep), output.reason

        return slime_filter

    # ----- samples in and out ----------------------------------------------------------------------
    def _as_slime_prompt(self, sample: Sample) -> None:
        """slime hands hooks the prompt as the text it was tokenized from (chat template applied)."""
        if self.config.apply_chat_template:
            sample.prompt = render_prompt(self.ctx.tokenizer, sample.prompt, apply_chat_template=True,
                                          chat_template_kwargs=self.config.apply_chat_template_kwargs)

    def _complete(self, sample: Sample, origin: Sample) -> None:
        """Fill in what a slime-style hook leaves out and refuse what cannot be trained."""
        for name in ("group_index", "index", "session_id"):
            if getattr(sample, name) is None:
                setattr(sample, name, getattr(origin, name))
        n = sample.response_length
        if sample.loss_mask is None:  # slime's None: every response token is trained
            sample.loss_mask = [1] * n
        if len(sample.token_versions) != n:
            # Tokens set directly instead of through append_response_tokens: take the version of
            # the last finished turn the hook recorded.
            known = sample.token_versions[-1] if sample.token_versions else 0
            version = policy_version(sample.weight_versions[-1]) if sample.weight_versions else known
            sample.token_versions = (sample.token_versions + [version] * n)[:n]
        if n and len(sample.rollout_logprobs) != n:
            raise GenerationFailed(
                f"sample {sample.group_index}/{sample.index}: the slime-style hook returned {n} response tokens but "
                f"{len(sample.rollout_logprobs)} rollout_log_probs; request \"return_logprob\": true and pass "
                "log_probs to append_response_tokens (training here needs the engine's logprobs)")


def _restart(sample: Sample, prompt_tokens: list[int]) -> None:
    sample.tokens = list(prompt_tokens)
    sample.response_length = 0
    sample.loss_mask = []
    sample.rollout_logprobs = []
    sample.token_versions = []
    sample.weight_versions = []
    sample.response = ""
    sample.status = Status.PENDING


def _as_list(result: Any, what: str) -> list[Sample]:
    items = result if isinstance(result, list) else [result]
    for item in items:
        if not isinstance(item, (Sample, list)):
            raise GenerationFailed(f"the slime-style {what} returned {type(item).__name__}, not a Sample")
    return items


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


async def _resolve(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
