"""Generation through the router, and the contract of generate hooks.

A generate hook is ``async def generate(ctx, sample, sampling_params) -> Sample | list[Sample]``.
``ctx.generate_turn(sample, sampling_params)`` runs one model turn: it sends prompt + everything
so far as ``input_ids`` and appends the new tokens to the sample as trainable tokens with their
logprobs and the policy version that produced them. When a weight update aborts the request the
tokens generated so far are kept and the turn is resumed from them with the remaining budget —
partial rollout; nothing restarts from scratch. Tool or environment output is appended with
``sample.append_observation(token_ids)`` (loss_mask 0). Text is never re-tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slime_async.actor import ActorRef
from slime_async.engine_client import GenerateOutput, parse_generate_output
from slime_async.sample import Sample, Status

MAX_RESUMES = 64  # a turn aborted this often is not making progress: fail it instead of looping


class GenerationFailed(RuntimeError):
    pass


def version_of(weight_version: str | None) -> int:
    """The policy version an engine reports; SGLang starts at "default", which is version 0."""
    try:
        return int(weight_version)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0


@dataclass
class GenerateContext:
    """What a generate hook may use: the router (engines), the tokenizer and the config."""

    router: ActorRef
    tokenizer: Any
    config: Any  # RolloutConfig
    vocab_size: int | None = None  # the model's (may exceed the tokenizer's, padded)

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                       session_id: str | None = None) -> GenerateOutput:
        """One raw request through the router (no resume): SGLang's answer, parsed."""
        # SGLang does not check ids against the vocabulary and its scheduler dies on one that is
        # out of range: a hook's bad token must fail this sample, not an engine.
        vocab = self.vocab_size
        if vocab is not None and input_ids and not 0 <= min(input_ids) <= max(input_ids) < vocab:
            raise GenerationFailed(f"input_ids hold a token id outside the vocabulary [0, {vocab})")
        # No timeout here: a request waits in the router while weights sync, and the router
        # bounds each engine call itself (--router-request-timeout / --engine-request-timeout).
        response = await self.router.ask("generate", input_ids, sampling_params, session_id=session_id,
                                         timeout=None)
        output = parse_generate_output(response)
        if output.logprobs is None:
            raise GenerationFailed(f"engine {response.get('engine_url')} returned no logprobs")
        return output

    async def generate_turn(self, sample: Sample, sampling_params: dict[str, Any],
                            max_new_tokens: int | None = None) -> str:
        """Generate one model turn onto ``sample``; returns the finish type (stop | length).

        ``max_new_tokens`` is this turn's budget (default: the sampling params'). Aborted
        requests are resumed from their partial tokens until the budget is spent.
        """
        budget = sampling_params.get("max_new_tokens", 0) if max_new_tokens is None else max_new_tokens
        produced = 0
        for _ in range(MAX_RESUMES):
            remaining = budget - produced
            if remaining <= 0:
                return "length"
            output = await self.generate(sample.tokens, {**sampling_params, "max_new_tokens": remaining},
                                         session_id=sample.session_id)
            sample.append_generated(output.output_ids, output.logprobs, version_of(output.weight_version))
            produced += len(output.output_ids)
            if output.finish_type != "abort":
                return output.finish_type
            # What resumption saves: these tokens are not generated again.
            sample.metadata["resumes"] = sample.metadata.get("resumes", 0) + 1
            sample.metadata["tokens_kept_on_abort"] = sample.metadata.get("tokens_kept_on_abort", 0) + len(output.output_ids)
        raise GenerationFailed(f"sample {sample.group_index}/{sample.index}: aborted {MAX_RESUMES} times")


async def default_generate(ctx: GenerateContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Single turn, token ids in and out."""
    finish = await ctx.generate_turn(sample, sampling_params)
    sample.status = Status.COMPLETED if finish == "stop" else Status.TRUNCATED
    return sample
