"""One completion through the router: text stop strings, chunked generation, resume after aborts.

Engines only know stop token ids, so text ``stop`` strings are the front's job. With stop
strings (or a streaming client) the completion is asked for in chunks of ``chunk_tokens``: after
each chunk the decoded text is searched (`slime_async.stop_strings`), and at a match the tokens
are cut at the one that completes the stop string. A stop therefore costs at most one chunk of extra decoding instead of
the whole ``max_new_tokens`` budget, and it works the same on SGLang, the CPU engine and external
engines. Each continuation resubmits prompt + tokens so far, which the engine's prefix cache
serves without recomputing them.

The same loop resumes a request that a weight sync aborted: it returns with finish_reason abort
and its tokens so far, and the loop continues from them with the remaining budget, so a client
sees one complete answer whose per-token weight versions say which policy produced what.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from slime_async.generate_output import parse_generate_output
from slime_async.stop_strings import DecodeFn, find_stop

MAX_ABORTS = 64  # a completion aborted this often is not making progress

SendFn = Callable[[list[int], dict[str, Any]], Awaitable[dict[str, Any]]]


class CompletionFailed(RuntimeError):
    """The engines could not finish this completion (no logprobs, endless aborts)."""


@dataclass
class CompletionSpec:
    prompt_ids: list[int]
    sampling_params: dict[str, Any]  # SGLang's names, without max_new_tokens and text stops
    max_new_tokens: int | None  # None: until the context ends
    stop: tuple[str, ...] = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    chunk_tokens: int | None = None  # ask the engine for at most this many tokens per request


@dataclass
class Completion:
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)  # per token, as engines report
    finish_reason: dict[str, Any] | None = None  # SGLang's: {"type": stop|length, "matched"?: ...}
    cached_tokens: int = 0  # of the first request (the prompt's prefix-cache hit)
    requests: int = 0
    resumes: int = 0  # continuations after a weight-sync abort

    @property
    def finish_type(self) -> str:
        return str((self.finish_reason or {}).get("type", ""))

    @property
    def weight_version(self) -> str | None:
        return self.weight_versions[-1] if self.weight_versions else None


ProgressFn = Callable[[Completion, bool], Awaitable[None] | None]


async def complete(send: SendFn, spec: CompletionSpec, decode: DecodeFn, context_len: int | None = None,
                   on_progress: ProgressFn | None = None) -> Completion:
    """Generate until a stop (token or text), the budget, or the context end.

    ``send(input_ids, sampling_params)`` is one router request; ``decode(ids)`` renders text
    for stop matching; ``on_progress(completion, final)`` sees every step (for streaming).
    """
    out = Completion()
    aborts = 0
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
        response = await send(spec.prompt_ids + out.output_ids, {**spec.sampling_params, "max_new_tokens": ask})
        parsed = parse_generate_output(response)
        if parsed.logprobs is None:
            raise CompletionFailed(f"engine {response.get('engine_url')} returned no logprobs")
        if out.requests == 0:
            out.cached_tokens = parsed.cached_tokens
        out.requests += 1
        out.output_ids += parsed.output_ids
        out.logprobs += parsed.logprobs
        out.weight_versions += [parsed.weight_version] * len(parsed.output_ids)
        if spec.stop and parsed.output_ids:
            hit = find_stop(out.output_ids, decode, spec.stop, first=produced)
            if hit is not None:
                cut, matched = hit
                del out.output_ids[cut:], out.logprobs[cut:], out.weight_versions[cut:]
                out.finish_reason = {"type": "stop", "matched": matched}
                break
        if parsed.finish_type == "abort":
            aborts += 1
            out.resumes += 1
            if aborts > MAX_ABORTS:
                raise CompletionFailed(f"aborted {MAX_ABORTS} times without finishing")
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


async def _notify(on_progress: ProgressFn | None, out: Completion, final: bool) -> None:
    if on_progress is not None:
        result = on_progress(out, final)
        if inspect.isawaitable(result):
            await result


def completion_text(completion: Completion, decode: Callable[[list[int]], str], no_stop_trim: bool) -> str:
    """The text SGLang would answer: a matched stop string (or stop token) is trimmed from the
    text, not from the ids, unless ``no_stop_trim``."""
    ids = completion.output_ids
    matched = (completion.finish_reason or {}).get("matched")
    if no_stop_trim or matched is None:
        return decode(ids)
    if isinstance(matched, str):
        text = decode(ids)
        position = text.find(matched)
        return text[:position] if position >= 0 else text
    return decode(ids[:-1]) if ids else ""


class TextStream:
    """Text deltas for a streaming client: only text that can no longer change is sent.

    Held back: a trailing partial UTF-8 character (decoded as U+FFFD until its last byte comes)
    and a tail that could be the start of a stop string (it would be trimmed if the stop
    completes).
    """

    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(stops)
        self.sent = 0

    def delta(self, text: str, final: bool) -> str:
        end = len(text) if final else len(text) - self._holdback(text)
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent:end], end
        return piece

    def _holdback(self, text: str) -> int:
        settled = text.rstrip("\ufffd")
        partial = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(settled)), 0, -1):
                if settled.endswith(stop[:size]):
                    partial = max(partial, size)
                    break
        return len(text) - len(settled) + partial
