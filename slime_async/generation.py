"""The one generation loop: a completion through the router, in as many engine requests as it takes.

Both users run it: the rollout's ``ctx.generate_turn`` (actors/rollout/generate.py) and the
router's HTTP front (actors/router/http_front.py). It owns:

- the budget (``max_new_tokens``; None: until the context ends) and the context end;
- text stop strings: engines only know stop token ids, so with ``stop`` (or a streaming client)
  the completion is asked for ``chunk_tokens`` at a time and after each chunk the decoded text is
  searched (`slime_async.stop_strings.StopSearch`: only the new tokens are decoded and only the
  text they can have changed is searched, so a long completion costs no more per chunk than a
  short one); at a match the tokens are cut after the one
  that completes the stop string. A stop costs at most one chunk of extra decoding, on any engine.
  Each continuation resubmits prompt + tokens so far, which the engine's prefix cache serves;
- resume after a weight-sync abort: the request returns with finish_reason abort and its tokens
  so far, and the loop continues from them with the remaining budget (partial rollout), at most
  ``MAX_ABORTS`` times;
- each token's weight version as the engine's answer reports it (``weight_version_segments``:
  the CPU engine, or the router when it streamed a request across an in-place sync), so one
  request that ran across a sync carries both versions;
- each token's most likely alternatives (``top_logprobs_num``), kept beside its logprob;
- routed experts (``routed``: MoE rollout routing replay): each request asks for them, and since
  every answer covers its whole input (prompt + tokens so far) the latest one is kept, converted to
  the runtime's layout (slime_async/routed_experts.py); a resume therefore needs no joining;
- counters: requests, resumes, tokens kept on abort, the prompt's cached tokens;
- ``on_progress(completion, final)`` after every request, for streaming.

Knows nothing of samples, HTTP or the router's internals: ``send`` is one engine request.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from slime_async.generate_output import GenerateOutput, parse_generate_output
from slime_async.incremental_text import IncrementalText
from slime_async.routed_experts import RoutedExpertsError, RoutedLayout, trim
from slime_async.stop_strings import DecodeFn, StopSearch

MAX_ABORTS = 64  # a completion aborted this often is not making progress: it fails


class GenerationFailed(RuntimeError):
    """The engines could not finish this completion (no logprobs, endless aborts, a bad request)."""


@dataclass
class CompletionSpec:
    prompt_ids: list[int]
    sampling_params: dict[str, Any]  # SGLang's names, without max_new_tokens and text stops
    max_new_tokens: int | None  # None: until the context ends
    stop: tuple[str, ...] = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    chunk_tokens: int | None = None  # ask the engine for at most this many tokens per request
    top_logprobs_num: int = 0  # each token's most likely alternatives too (``send`` asks the engine)
    # Text that ends the prompt but belongs to the answer (the front's forced tool-call opening):
    # not generated here, read back in front of the completion's text when it is parsed.
    answer_prefix: str = ""
    logprob_start_len: int | None = None  # SGLang's prompt logprobs from there on (first request only)
    routed: RoutedLayout | None = None  # ask for the routed experts, of a model of this layout


@dataclass
class Completion:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)  # per token, as engines report
    finish_reason: dict[str, Any] | None = None  # SGLang's: {"type": stop|length, "matched"?: ...}
    cached_tokens: int = 0  # of the first request (the prompt's prefix-cache hit)
    requests: int = 0
    resumes: int = 0  # continuations after a weight-sync abort
    tokens_kept_on_abort: int = 0  # what resumption saved: tokens not generated again
    # The text so far, for whoever streams it (the front): decoded a chunk at a time, not again
    # from the start after every chunk. Not part of the completion's value.
    text: IncrementalText | None = field(default=None, compare=False, repr=False)
    # per token its (logprob, token id) alternatives, most likely first: only with top_logprobs_num
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_logprobs: list[Any] = field(default_factory=list)  # of the first request: the prompt's
    # With spec.routed: int32 [len(prompt_ids) + len(output_ids) - 1, moe layers, top_k]
    routed_experts: Any = field(default=None, compare=False, repr=False)

    @property
    def finish_type(self) -> str:
        return str((self.finish_reason or {}).get("type", ""))

    @property
    def weight_version(self) -> str | None:
        return self.weight_versions[-1] if self.weight_versions else None


# send(input_ids, sampling_params[, logprob_start_len=][, return_routed_experts=]): one engine
# request, SGLang's answer dict (each keyword only when the spec asks for it).
SendFn = Callable[..., Awaitable[dict[str, Any]]]
ProgressFn = Callable[[Completion, bool], Awaitable[None] | None]


async def complete(send: SendFn, spec: CompletionSpec, decode: DecodeFn | None, context_len: int | None = None,
                   on_progress: ProgressFn | None = None, out: Completion | None = None) -> Completion:
    """Generate until a stop (token or text), the budget, or the context end.

    ``decode(ids)`` renders text for stop matching (needed only with ``spec.stop``);
    ``on_progress(completion, final)`` sees every step. ``out``: an empty Completion to fill
    (so ``send`` can see the counters so far, e.g. to label a resumed request).
    """
    if spec.stop and decode is None:
        raise GenerationFailed("text stop strings need a tokenizer to match them")
    out = Completion() if out is None else out
    if spec.max_new_tokens == 0 and spec.logprob_start_len is not None:
        # SGLang's scoring request: one prefill for the prompt's logprobs, no output token.
        response = await send(spec.prompt_ids, {**spec.sampling_params, "max_new_tokens": 0},
                              logprob_start_len=spec.logprob_start_len)
        _first_request(out, response)
        out.requests = 1
        out.finish_reason = {"type": "length", "length": 0}
        await _notify(on_progress, out, True)
        return out
    search = StopSearch(decode, spec.stop) if spec.stop else None
    while True:
        produced = len(out.output_ids)
        remaining = None if spec.max_new_tokens is None else spec.max_new_tokens - produced
        if remaining is not None and remaining <= 0:
            out.finish_reason = {"type": "length", "length": spec.max_new_tokens}
            break
        if context_len is not None and len(spec.prompt_ids) + produced >= context_len:
            out.finish_reason = {"type": "length", "length": produced}
            break
        ask = remaining
        if spec.chunk_tokens is not None:
            ask = spec.chunk_tokens if remaining is None else min(remaining, spec.chunk_tokens)
        params = {**spec.sampling_params, "max_new_tokens": ask}
        extra: dict[str, Any] = {} if spec.routed is None else {"return_routed_experts": True}
        if out.requests == 0 and spec.logprob_start_len is not None:
            extra["logprob_start_len"] = spec.logprob_start_len
        response = await send(spec.prompt_ids + out.output_ids, params, **extra)
        parsed = _first_request(out, response) if out.requests == 0 else parse_generate_output(response)
        if parsed.logprobs is None:
            raise GenerationFailed(f"engine {response.get('engine_url')} returned no logprobs")
        if spec.routed is not None:
            _take_routed(out, spec, response, parsed, len(spec.prompt_ids) + produced)
        out.requests += 1
        out.output_ids += parsed.output_ids
        out.logprobs += parsed.logprobs
        out.weight_versions += token_versions(parsed)
        if spec.top_logprobs_num:
            if parsed.top_logprobs is None and parsed.output_ids:
                raise GenerationFailed(f"engine {response.get('engine_url')} returned no top logprobs "
                                       f"(asked for {spec.top_logprobs_num} with top_logprobs_num)")
            out.top_logprobs += parsed.top_logprobs or []
        if search is not None and parsed.output_ids:
            hit = search.feed(out.output_ids, first=produced)
            if hit is not None:
                cut, matched = hit
                del out.output_ids[cut:], out.logprobs[cut:], out.weight_versions[cut:], out.top_logprobs[cut:]
                out.routed_experts = trim(out.routed_experts, len(spec.prompt_ids) + cut - 1)
                out.finish_reason = {"type": "stop", "matched": matched}
                break
        if parsed.finish_type == "abort":
            out.resumes += 1
            out.tokens_kept_on_abort += len(parsed.output_ids)
            if out.resumes >= MAX_ABORTS:
                raise GenerationFailed(f"aborted {MAX_ABORTS} times without finishing")
            await _notify(on_progress, out, False)
            continue
        chunk_ended = (parsed.finish_type == "length" and ask is not None and len(parsed.output_ids) >= ask
                       and (remaining is None or ask < remaining))
        if chunk_ended:
            await _notify(on_progress, out, False)
            continue
        if parsed.finish_type == "length":
            out.finish_reason = {"type": "length", "length": spec.max_new_tokens or len(out.output_ids)}
        else:
            out.finish_reason = parsed.finish_reason or {"type": parsed.finish_type or "stop"}
        break
    await _notify(on_progress, out, True)
    return out


def _first_request(out: Completion, response: dict[str, Any]) -> GenerateOutput:
    """What only the first request tells: the prompt's cached tokens and its logprobs."""
    parsed = parse_generate_output(response)
    out.cached_tokens = parsed.cached_tokens
    out.input_token_logprobs = list((response.get("meta_info") or {}).get("input_token_logprobs") or [])
    return parsed


def _take_routed(out: Completion, spec: CompletionSpec, response: dict[str, Any], parsed: GenerateOutput,
                 fed: int) -> None:
    """Keep an answer's routed experts: its input (``fed`` tokens) and its output tokens but the
    last went through the model."""
    encoded = (response.get("meta_info") or {}).get("routed_experts")
    new = len(parsed.output_ids)
    if encoded is None:
        if new == 0 and parsed.finish_type == "abort":
            return  # aborted before its prefill: nothing ran, the experts so far stand
        raise GenerationFailed(f"engine {response.get('engine_url')} answered without meta_info.routed_experts: "
                               "start it with --enable-return-routed-experts (SGLang's flag; the runtime sets it "
                               "on the engines it owns under --use-rollout-routing-replay)")
    try:
        out.routed_experts = spec.routed.decode(encoded, fed + new - 1)
    except RoutedExpertsError as error:
        raise GenerationFailed(f"engine {response.get('engine_url')}: {error}") from None


def token_versions(output: GenerateOutput) -> list[str | None]:
    """The weight version of each output token: the answer's per-token versions, else its one."""
    if output.token_versions is not None:
        return list(output.token_versions)
    return [output.weight_version] * len(output.output_ids)


async def _notify(on_progress: ProgressFn | None, out: Completion, final: bool) -> None:
    if on_progress is not None:
        result = on_progress(out, final)
        if inspect.isawaitable(result):
            await result
