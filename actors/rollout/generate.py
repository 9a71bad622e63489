"""Generation through the router, and the contract of generate hooks.

A generate hook is ``async def generate(ctx, sample, sampling_params) -> Sample | list[Sample]``.
``ctx.generate_turn(sample, sampling_params)`` runs one model turn: it sends prompt + everything
so far as ``input_ids`` and appends the new tokens to the sample as trainable tokens with their
logprobs and the policy version that produced them. When a weight update aborts the request the
tokens generated so far are kept and the turn is resumed from them with the remaining budget —
partial rollout; nothing restarts from scratch. Tool or environment output is appended with
``sample.append_observation(token_ids)`` (loss_mask 0). Text is never re-tokenized.

Agents that speak HTTP instead (any OpenAI client) get a per-sample base URL,
``ctx.openai_base_url(sample)``, on the router's HTTP front; the front records that session's
turns token-exactly and ``await ctx.collect_trajectory(sample)`` returns them as Samples
(``slime_async.trajectory``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slime_async.actor import ActorRef
from slime_async.generate_output import GenerateOutput, parse_generate_output
from slime_async.sample import Sample, Status, policy_version
from slime_async.stop_strings import find_stop
from slime_async.trace import TraceRecorder
from slime_async.trajectory import to_samples

MAX_RESUMES = 64  # a turn aborted this often is not making progress: fail it instead of looping
STOP_CHUNK_TOKENS = 16  # tokens per request while watching for a text stop string (the front's default)
TRAJECTORY_SESSION = "trajectory_session"  # sample.metadata key: the session openai_base_url opened


class GenerationFailed(RuntimeError):
    pass


@dataclass
class GenerateContext:
    """What a generate hook may use: the router (engines), the tokenizer and the config."""

    router: ActorRef
    tokenizer: Any
    config: Any  # RolloutConfig
    vocab_size: int | None = None  # the model's (may exceed the tokenizer's, padded)
    router_url: str | None = None  # the router's HTTP front, "http://127.0.0.1:PORT" (None: no front)
    router_api_key: str | None = None  # what clients of the front must send (--router-api-key)
    # --trace-dir: the run's timeline; a hook may add its own spans (tool calls, ...) to it.
    trace: TraceRecorder = field(default_factory=TraceRecorder.off)

    def openai_base_url(self, sample: Sample) -> str:
        """An OpenAI ``base_url`` (``.../sessions/<id>/v1``) whose requests are this sample's:
        routed to one engine and recorded for ``collect_trajectory``."""
        return f"{self._front_url()}/sessions/{self.trajectory_session(sample)}/v1"

    def anthropic_base_url(self, sample: Sample) -> str:
        """An Anthropic ``base_url`` (``.../sessions/<id>``: the client appends ``/v1/messages``)
        for the same session as ``openai_base_url(sample)``."""
        return f"{self._front_url()}/sessions/{self.trajectory_session(sample)}"

    def trajectory_session(self, sample: Sample) -> str:
        """The session id of the sample's trajectory (made on first use, kept in its metadata);
        send it as ``X-Session-Id`` or use the ``/sessions/<id>/`` prefix for SGLang's /generate."""
        session = sample.metadata.get(TRAJECTORY_SESSION)
        if session is None:
            # Unique per attempt: a retried group must not find the recording of a failed one.
            session = f"{sample.session_id or 'sample'}-{sample.index}-{uuid.uuid4().hex[:8]}"
            sample.metadata[TRAJECTORY_SESSION] = session
        return session

    async def collect_trajectory(self, sample: Sample) -> list[Sample]:
        """The turns recorded under the sample's session, as training Samples (the session is
        then forgotten). Model tokens are trainable with their logprobs and versions, the rest
        (template glue, tool results, user turns) loss_mask 0. One Sample, ``sample`` itself,
        unless a turn's prompt does not extend the previous turn's prompt + completion (a
        template that re-renders history): then each such break starts another Sample."""
        session = sample.metadata.pop(TRAJECTORY_SESSION, None)
        if session is None:
            raise GenerationFailed("collect_trajectory: this sample has no session; call ctx.openai_base_url(sample) "
                                   "before running the agent")
        try:
            turns = await self.router.ask("take_trajectory", session)
        except LookupError as error:
            raise GenerationFailed(f"collect_trajectory: {error}") from None
        pieces = to_samples(turns, sample)
        for piece in pieces:
            if self.tokenizer is not None:
                piece.response = self.tokenizer.decode(piece.response_tokens, skip_special_tokens=True)
        return pieces

    def _front_url(self) -> str:
        if not self.router_url:
            raise GenerationFailed("this run's router has no HTTP front (ctx.router_url is None)")
        return self.router_url.rstrip("/")

    async def generate(self, input_ids: list[int], sampling_params: dict[str, Any], *,
                       session_id: str | None = None, trace_args: dict[str, Any] | None = None) -> GenerateOutput:
        """One raw request through the router (no resume): SGLang's answer, parsed. ``trace_args``
        label its span on the --trace-dir timeline."""
        # SGLang does not check ids against the vocabulary and its scheduler dies on one that is
        # out of range: a hook's bad token must fail this sample, not an engine.
        vocab = self.vocab_size
        if vocab is not None and input_ids and not 0 <= min(input_ids) <= max(input_ids) < vocab:
            raise GenerationFailed(f"input_ids hold a token id outside the vocabulary [0, {vocab})")
        # No timeout here: a request waits in the router while weights sync, and the router
        # bounds each engine call itself (--router-request-timeout / --engine-request-timeout).
        response = await self.router.ask("generate", input_ids, sampling_params, session_id=session_id,
                                         trace_args=trace_args, timeout=None)
        output = parse_generate_output(response)
        if output.logprobs is None:
            raise GenerationFailed(f"engine {response.get('engine_url')} returned no logprobs")
        return output

    async def generate_turn(self, sample: Sample, sampling_params: dict[str, Any],
                            max_new_tokens: int | None = None, *, stop: Sequence[str] = (),
                            chunk_tokens: int = STOP_CHUNK_TOKENS) -> str:
        """Generate one model turn onto ``sample``; returns the finish type (stop | length).

        ``max_new_tokens`` is this turn's budget (default: the sampling params'). Aborted
        requests are resumed from their partial tokens until the budget is spent. ``stop``:
        text stop strings (engines know only stop token ids): the turn is asked for
        ``chunk_tokens`` at a time and, once its decoded text holds a stop string, ends with the
        token that completes it (kept, as it was sampled; nothing after it is) — how a tool-using
        hook ends a turn at ``</code>`` or a closing fence on any engine and tokenizer.
        """
        budget = sampling_params.get("max_new_tokens", 0) if max_new_tokens is None else max_new_tokens
        if stop and self.tokenizer is None:
            raise GenerationFailed("generate_turn(stop=...) needs the run's tokenizer to match text")
        # This turn's tokens, as (ids, logprobs, versions) per request: appended to the sample at
        # the end, so a stop string's tail can be cut before anything is recorded. A request that
        # ran across an in-place weight sync has tokens of two versions.
        pieces: list[tuple[list[int], list[float], list[int]]] = []
        turn: list[int] = []
        aborts = 0
        finish = "length"
        while budget - len(turn) > 0:
            remaining = budget - len(turn)
            ask = min(remaining, chunk_tokens) if stop else remaining
            output = await self.generate(sample.tokens + turn, {**sampling_params, "max_new_tokens": ask},
                                         session_id=sample.session_id, trace_args={
                                             "group": sample.group_index, "sample": sample.index, "resumed": aborts > 0})
            pieces.append((output.output_ids, output.logprobs, _token_versions(output)))
            produced, turn = len(turn), turn + output.output_ids
            if stop and output.output_ids:
                hit = find_stop(turn, self.tokenizer.decode, stop, first=produced)
                if hit is not None:
                    turn = turn[:hit[0]]
                    finish = "stop"
                    break
            if output.finish_type == "abort":
                # What resumption saves: these tokens are not generated again.
                sample.metadata["resumes"] = sample.metadata.get("resumes", 0) + 1
                sample.metadata["tokens_kept_on_abort"] = sample.metadata.get("tokens_kept_on_abort", 0) + len(output.output_ids)
                aborts += 1
                if aborts >= MAX_RESUMES:
                    raise GenerationFailed(f"sample {sample.group_index}/{sample.index}: aborted {MAX_RESUMES} times")
                continue
            chunk_ended = stop and output.finish_type == "length" and len(output.output_ids) >= ask
            if not chunk_ended:
                finish = output.finish_type
                break
        kept = len(turn)
        for ids, logprobs, versions in pieces:
            take = min(len(ids), kept)
            start = 0
            while start < take:  # one append per stretch of one version
                end = start + 1
                while end < take and versions[end] == versions[start]:
                    end += 1
                sample.append_generated(ids[start:end], logprobs[start:end], versions[start])
                start = end
            kept -= take
        return finish


def _token_versions(output: GenerateOutput) -> list[int]:
    """The policy version of each output token (the answer's per-token versions, else its one)."""
    if output.token_versions is not None:
        return [policy_version(v) for v in output.token_versions]
    return [policy_version(output.weight_version)] * len(output.output_ids)


async def default_generate(ctx: GenerateContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Single turn, token ids in and out."""
    finish = await ctx.generate_turn(sample, sampling_params)
    sample.status = Status.COMPLETED if finish == "stop" else Status.TRUNCATED
    return sample
