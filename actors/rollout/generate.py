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
from slime_async.generation import MAX_ABORTS, Completion, CompletionSpec, GenerationFailed, complete
from slime_async.routed_experts import RoutedLayout
from slime_async.sample import Sample, Status, policy_version
from slime_async.token_ids import out_of_vocabulary
from slime_async.trace import TraceRecorder
from slime_async.trajectory import to_samples

MAX_RESUMES = MAX_ABORTS  # a turn aborted this often is not making progress: it fails (the loop's one limit)
STOP_CHUNK_TOKENS = 16  # tokens per request while watching for a text stop string (the front's default)
TRAJECTORY_SESSION = "trajectory_session"  # sample.metadata key: the session openai_base_url opened


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
    # --use-rollout-routing-replay: the policy's MoE layout; each turn then asks for the routed experts
    routed_layout: RoutedLayout | None = None

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
        response = await self._ask(input_ids, sampling_params, session_id=session_id, trace_args=trace_args)
        output = parse_generate_output(response)
        if output.logprobs is None:
            raise GenerationFailed(f"engine {response.get('engine_url')} returned no logprobs")
        return output

    async def _ask(self, input_ids: list[int], sampling_params: dict[str, Any], *, session_id: str | None,
                   trace_args: dict[str, Any] | None, return_routed_experts: bool = False) -> dict[str, Any]:
        """One request through the router: SGLang's answer dict."""
        # A hook's bad token must fail this sample, not kill an engine (slime_async/token_ids.py).
        problem = out_of_vocabulary(input_ids, self.vocab_size)
        if problem:
            raise GenerationFailed(problem)
        # No timeout here: a request waits in the router while weights sync, and the router
        # bounds each engine call itself (--router-request-timeout / --engine-request-timeout).
        routed = {"return_routed_experts": True} if return_routed_experts else {}
        return await self.router.ask("generate", input_ids, sampling_params, session_id=session_id,
                                     trace_args=trace_args, timeout=None, **routed)

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
        The loop is `slime_async.generation.complete`, the one the router's HTTP front runs.
        With ``routed_layout`` (--use-rollout-routing-replay) the sample's ``rollout_routed_experts``
        become the latest answer's: they cover every token of the sample but the last.
        """
        budget = sampling_params.get("max_new_tokens", 0) if max_new_tokens is None else max_new_tokens
        if stop and self.tokenizer is None:
            raise GenerationFailed("generate_turn(stop=...) needs the run's tokenizer to match text")
        params = {k: v for k, v in sampling_params.items() if k != "max_new_tokens"}
        spec = CompletionSpec(list(sample.tokens), params, budget, tuple(stop),
                              chunk_tokens=chunk_tokens if stop else None, routed=self.routed_layout)

        turn = Completion()

        async def send(input_ids: list[int], request: dict[str, Any], **extra: Any) -> dict[str, Any]:
            return await self._ask(input_ids, request, session_id=sample.session_id, trace_args={
                "group": sample.group_index, "sample": sample.index, "resumed": turn.resumes > 0}, **extra)

        decode = self.tokenizer.decode if stop else None
        try:
            await complete(send, spec, decode, out=turn)
        except GenerationFailed as error:
            raise GenerationFailed(f"sample {sample.group_index}/{sample.index}: {error}") from None
        if turn.resumes:
            sample.metadata["resumes"] = sample.metadata.get("resumes", 0) + turn.resumes
            sample.metadata["tokens_kept_on_abort"] = (sample.metadata.get("tokens_kept_on_abort", 0)
                                                       + turn.tokens_kept_on_abort)
        # A request that ran across an in-place weight sync has tokens of two versions: one
        # append per stretch of one version.
        versions = [policy_version(v) for v in turn.weight_versions]
        start = 0
        while start < len(versions):
            end = start + 1
            while end < len(versions) and versions[end] == versions[start]:
                end += 1
            sample.append_generated(turn.output_ids[start:end], turn.logprobs[start:end], versions[start])
            start = end
        if turn.routed_experts is not None:
            sample.rollout_routed_experts = turn.routed_experts
        return turn.finish_type


async def default_generate(ctx: GenerateContext, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Single turn, token ids in and out."""
    finish = await ctx.generate_turn(sample, sampling_params)
    sample.status = Status.COMPLETED if finish == "stop" else Status.TRUNCATED
    return sample
