"""SGLang's native ``/generate`` as the front serves it: request parsing, response shapes.

Accepts what SGLang's ``GenerateReqInput`` accepts for text generation — ``text`` or
``input_ids`` (one prompt or a batch), ``sampling_params`` (one for all or one per prompt),
``return_logprob`` (with ``logprob_start_len``: the prompt's logprobs, passed to the engine),
``top_logprobs_num``, ``rid``, ``stream`` — and answers in SGLang's format. Text ``stop`` strings
and ``no_stop_trim`` are handled by the front (see completion.py), everything else in
``sampling_params`` goes to the engines. Errors are SGLang's ``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable

from actors.router.completion import Completion, CompletionSpec
from slime_async.engine_client import check_sampling_params
from slime_async.generate_request import per_request
from slime_async.token_ids import out_of_vocabulary

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128

# GenerateReqInput fields that change nothing here (token text in the logprob entries is never
# returned; the rest are SGLang deployment options).
_IGNORED = {"return_text_in_logprobs", "log_metrics", "bootstrap_host", "bootstrap_port",
            "bootstrap_room", "data_parallel_rank", "custom_logit_processor", "lora_path", "priority",
            "return_hidden_states", "session_params", "modalities", "stream_output"}
_FIELDS = {"text", "input_ids", "sampling_params", "return_logprob", "rid", "stream", "top_logprobs_num",
           "logprob_start_len",
           "token_ids_logprob", "image_data", "audio_data", "video_data", "input_embeds"} | _IGNORED


class NativeError(ValueError):
    """Answered with HTTP 400 as ``{"error": {"message": ...}}``."""


@dataclass
class NativeItem:
    """One prompt × one sample of a /generate call."""

    rid: str
    spec: CompletionSpec
    return_logprob: bool


def parse_generate(body: Any, encode: Callable[[str], list[int]],
                   vocab_size: int | None = None) -> tuple[list[NativeItem], bool, bool]:
    """``(items, is_batch, stream)``; a prompt with ``sampling_params.n`` > 1 gives n items. A
    token id outside ``vocab_size`` is refused here: it would kill an SGLang engine."""
    if not isinstance(body, dict):
        raise NativeError("request body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise NativeError(f"unknown /generate field(s): {', '.join(unknown)}")
    for name in ("image_data", "audio_data", "video_data", "input_embeds", "token_ids_logprob"):
        if body.get(name) is not None:
            raise NativeError(f"{name} is not supported by the slime-async router")
    if body.get("input_ids") is not None:
        prompts = body["input_ids"]
        is_batch = isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], list)
        prompts = prompts if is_batch else [prompts]
        for i, ids in enumerate(prompts):
            name = f"input_ids[{i}]" if is_batch else "input_ids"
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise NativeError(f"{name} must be a non-empty list of token ids")
            problem = out_of_vocabulary(ids, vocab_size, name)
            if problem:
                raise NativeError(problem)
    elif body.get("text") is not None:
        text = body["text"]
        is_batch = isinstance(text, list)
        texts = text if is_batch else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise NativeError("text must be a string or a non-empty list of strings")
        prompts = [encode(t) for t in texts]
    else:
        raise NativeError("one of text or input_ids is required")
    n = len(prompts)
    sampling = per_request(body.get("sampling_params"), n, "sampling_params", dict, NativeError)
    logprob_flags = per_request(body.get("return_logprob"), n, "return_logprob", bool, NativeError)
    rids = per_request(body.get("rid"), n, "rid", str, NativeError)
    top_nums = per_request(body.get("top_logprobs_num"), n, "top_logprobs_num", int, NativeError)
    starts = per_request(body.get("logprob_start_len"), n, "logprob_start_len", int, NativeError)
    items = []
    for i, ids in enumerate(prompts):
        where = f"sampling_params[{i}]" if is_batch else "sampling_params"
        spec, samples = _spec(list(ids), sampling[i] or {}, where)
        top = top_nums[i] or 0
        # SGLang 0.5.17 checks neither bound below: a top-k past the vocabulary or a negative start
        # would reach its scheduler (refused here; the CPU engine refuses them too).
        if isinstance(top, bool) or top < 0 or (vocab_size is not None and top > vocab_size):
            raise NativeError(f"top_logprobs_num must be an integer in [0, {vocab_size or 'vocabulary size'}], "
                              f"got {top!r}")
        spec.top_logprobs_num = top if logprob_flags[i] else 0  # SGLang returns them only with return_logprob
        if logprob_flags[i] and starts[i] is not None and starts[i] != -1:
            if starts[i] < 0:
                raise NativeError(f"logprob_start_len must be -1 or a position in the input, got {starts[i]}")
            # Prompt logprobs: passed to the engine, which checks the start's upper bound (SGLang's message).
            spec.logprob_start_len = starts[i]
        rid = rids[i] or uuid.uuid4().hex
        for k in range(samples):
            items.append(NativeItem(rid if samples == 1 else f"{rid}-{k}", spec, bool(logprob_flags[i])))
    stream = bool(body.get("stream"))
    if stream and len(items) > 1:
        raise NativeError("stream=true needs a single prompt with n=1")
    return items, is_batch or len(items) > n, stream


def _spec(prompt_ids: list[int], raw: dict[str, Any], where: str) -> tuple[CompletionSpec, int]:
    params = dict(raw)
    stop = params.pop("stop", None)
    if stop is None or stop == "":
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise NativeError(f"{where}.stop must be a string or a list of strings")
    if params.pop("stop_regex", None):
        raise NativeError(f"{where}.stop_regex is not supported by the slime-async router; use stop strings")
    samples = params.pop("n", 1) or 1
    if not isinstance(samples, int) or samples < 1:
        raise NativeError(f"{where}.n must be a positive integer")
    max_new_tokens = params.pop("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 0):
        raise NativeError(f"{where}.max_new_tokens must be a non-negative integer or null")
    no_stop_trim = bool(params.pop("no_stop_trim", False))
    skip_special_tokens = params.pop("skip_special_tokens", True) is not False
    params.pop("spaces_between_special_tokens", None)
    try:
        check_sampling_params(params)
    except ValueError as error:
        raise NativeError(f"{where}: {error}") from None
    spec = CompletionSpec(prompt_ids, params, max_new_tokens, stops, no_stop_trim, skip_special_tokens)
    return spec, samples


def generate_response(item: NativeItem, completion: Completion, text: str, *, final: bool = True) -> dict[str, Any]:
    """SGLang's answer for one item; while streaming, cumulative and with finish_reason null."""
    meta: dict[str, Any] = {
        "id": item.rid,
        "finish_reason": completion.finish_reason if final else None,
        "prompt_tokens": len(item.spec.prompt_ids),
        "completion_tokens": len(completion.output_ids),
        "cached_tokens": completion.cached_tokens,
        "weight_version": completion.weight_version,
        # Extension: the weight version of every output token (a weight sync may land mid-answer).
        "output_token_weight_versions": list(completion.weight_versions),
    }
    if item.return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(completion.logprobs, completion.output_ids)]
        meta["input_token_logprobs"] = list(completion.input_token_logprobs)
        if item.spec.top_logprobs_num:
            meta["output_top_logprobs"] = [[[lp, tok, None] for lp, tok in top] for top in completion.top_logprobs]
            meta["input_top_logprobs"] = []
    return {"text": text, "output_ids": list(completion.output_ids), "meta_info": meta}
