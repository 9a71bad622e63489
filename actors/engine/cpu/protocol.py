"""SGLang's /generate wire format for the CPU engine: parse requests, shape responses.

Everything here is about JSON in and JSON out (field names, defaults, validation messages,
SGLang's output layout); the scheduler only sees the parsed `SamplingParams` and token ids.
Shapes follow SGLang's io_struct.py / sampling_params.py / tokenizer_manager.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.engine.cpu import routed_experts
from slime_async.generate_request import per_request
from slime_async.token_ids import out_of_vocabulary

if TYPE_CHECKING:  # avoid a runtime cycle: the scheduler imports SamplingParams from here
    from actors.engine.cpu.scheduler import Request


# One output token's most likely alternatives, as (logprob, token id), most likely first.
TopLogprobs = list[tuple[float, int]]

UNTIL_CONTEXT_END = 2**31 - 1  # max_new_tokens that only the context length cuts short


class BadRequest(ValueError):
    """Input the client must fix; answered with HTTP 400."""


# SGLang sampling fields this engine implements.
_SUPPORTED = {
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "stop_token_ids",
    "ignore_eos",
    "no_stop_trim",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "sampling_seed",
}
# SGLang sampling fields accepted only at their neutral value (a request that relies on
# them would silently get different behaviour otherwise).
_NEUTRAL = {
    "stop": (None, [], ""),
    "stop_regex": (None, [], ""),
    "min_p": (0.0,),
    "frequency_penalty": (0.0,),
    "presence_penalty": (0.0,),
    "repetition_penalty": (1.0,),
    "min_new_tokens": (0,),
    "n": (1,),
    "json_schema": (None,),
    "regex": (None,),
    "ebnf": (None,),
    "structural_tag": (None,),
    "custom_params": (None,),
    "stream_interval": (None,),
    "logit_bias": (None, {}),
}


@dataclass(frozen=True)
class SamplingParams:
    """The sampling fields of one /generate request, with SGLang's defaults."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    sampling_seed: int | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> "SamplingParams":
        """Parse SGLang's `sampling_params` dict; ValueError names the offending field."""
        raw = raw or {}
        if not isinstance(raw, dict):
            raise ValueError(f"sampling_params must be an object, got {type(raw).__name__}")
        for key, value in raw.items():
            if key in _SUPPORTED:
                continue
            if key in _NEUTRAL:
                if value not in _NEUTRAL[key]:
                    raise ValueError(f"sampling_params.{key}={value!r} is not supported by the CPU engine")
                continue
            raise ValueError(f"unknown sampling_params field {key!r}")

        def get(name: str, kind: type, default: Any) -> Any:
            value = raw.get(name)
            if value is None:
                return default
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"sampling_params.{name} must be {kind.__name__}, got {value!r}")
            return value

        stop_token_ids = get("stop_token_ids", list, [])
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_token_ids):
            raise ValueError(f"sampling_params.stop_token_ids must be a list of integers, got {stop_token_ids!r}")
        params = cls(
            temperature=get("temperature", float, 1.0),
            top_p=get("top_p", float, 1.0),
            top_k=get("top_k", int, -1),
            # An explicit null means "until the context is full", as in SGLang.
            max_new_tokens=get("max_new_tokens", int, UNTIL_CONTEXT_END if "max_new_tokens" in raw else 128),
            stop_token_ids=frozenset(stop_token_ids),
            ignore_eos=get("ignore_eos", bool, False),
            no_stop_trim=get("no_stop_trim", bool, False),
            skip_special_tokens=get("skip_special_tokens", bool, True),
            sampling_seed=get("sampling_seed", int, None),
        )
        if not params.temperature >= 0.0 or params.temperature == float("inf"):
            raise ValueError(
                f"sampling_params.temperature must be a non-negative finite number, got {params.temperature}"
            )
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {params.top_p}")
        if params.top_k < 1 and params.top_k != -1:
            raise ValueError(f"sampling_params.top_k must be -1 (disabled) or at least 1, got {params.top_k}")
        if params.max_new_tokens < 0:
            raise ValueError(f"sampling_params.max_new_tokens must be at least 0, got {params.max_new_tokens}")
        return params


def validate_input_ids(input_ids: Any, vocab_size: int, context_len: int) -> list[int]:
    """Check one prompt; ValueError says what is wrong with it."""
    if not isinstance(input_ids, list) or not input_ids:
        raise ValueError("input_ids must be a non-empty list of token ids")
    for i, token in enumerate(input_ids):
        if not isinstance(token, int) or isinstance(token, bool):
            raise ValueError(f"input_ids[{i}]={token!r} is not a token id")
    problem = out_of_vocabulary(input_ids, vocab_size)  # SGLang would die on it (slime_async/token_ids.py)
    if problem:
        raise ValueError(problem)
    if len(input_ids) >= context_len:
        raise ValueError(
            f"the input ({len(input_ids)} tokens) is longer than the model's context length ({context_len} tokens)"
        )
    return input_ids


@dataclass
class GenerateItem:
    """One prompt of a /generate call (a batch call has several)."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    top_logprobs_num: int = 0  # SGLang's top-level field: alternatives per output token
    # The first input position whose logprob is returned (resolved: never -1); len(input_ids)
    # returns none. See resolve_logprob_start_len.
    logprob_start_len: int | None = None
    return_routed_experts: bool = False  # SGLang's field: meta_info.routed_experts when the server records them

    def __post_init__(self) -> None:
        if self.logprob_start_len is None:
            self.logprob_start_len = resolve_logprob_start_len(-1, self.return_logprob, len(self.input_ids))


def resolve_logprob_start_len(requested: int, return_logprob: bool, n_input: int) -> int:
    """SGLang 0.5.17's scheduler (handle_generate_request): -1 (the default) or no return_logprob
    means "output tokens only", which it sets past the input (no input entry at all, generating or
    not; measured on the GPU, benchmarks/gpu/results/sglang_input_contract/). An explicit start may be
    anywhere up to the input's length (== length: no input entry); past it SGLang aborts the request
    with this message. Below -1 SGLang does not check (not measured what it does): refused here."""
    if requested == -1 or not return_logprob:
        return n_input
    if requested < -1:
        raise ValueError(f"logprob_start_len must be -1 or a position in the input, got {requested}")
    if requested > n_input:
        raise ValueError(f"req.logprob_start_len={requested} is higher than the number of input tokens "
                         f"len(req.origin_input_ids)={n_input}. Please use a smaller logprob_start_len.")
    return requested


def parse_generate(
    body: Any, vocab_size: int, context_len: int, tokenizer: Any | None
) -> tuple[list[GenerateItem], bool, bool]:
    """Split a /generate body into items; the flags say whether the caller sent a batch and
    whether it asked for a stream (one prompt only)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be a boolean, got {stream!r}")
    prompts = body.get("input_ids")
    if prompts is None and body.get("text") is not None:
        prompts = _tokenize(tokenizer, body["text"])
    if prompts is None:
        raise BadRequest("one of input_ids or text is required")
    is_batch = isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], list)
    prompt_list = prompts if is_batch else [prompts]
    n = len(prompt_list)
    sampling = per_request(body.get("sampling_params"), n, "sampling_params", dict, BadRequest)
    logprob_flags = per_request(body.get("return_logprob"), n, "return_logprob", bool, BadRequest)
    rids = per_request(body.get("rid"), n, "rid", str, BadRequest)
    top_nums = per_request(body.get("top_logprobs_num"), n, "top_logprobs_num", int, BadRequest)
    starts = per_request(body.get("logprob_start_len"), n, "logprob_start_len", int, BadRequest)
    routed = per_request(body.get("return_routed_experts"), n, "return_routed_experts", bool, BadRequest)
    items = []
    for i, ids in enumerate(prompt_list):
        where = f"input_ids[{i}]: " if is_batch else ""
        try:
            ids = validate_input_ids(ids, vocab_size, context_len)
            params = SamplingParams.from_json(sampling[i])
            if isinstance(starts[i], bool):
                raise ValueError(f"logprob_start_len must be int, got {starts[i]!r}")
            start = resolve_logprob_start_len(-1 if starts[i] is None else starts[i], bool(logprob_flags[i]), len(ids))
        except ValueError as exc:
            raise BadRequest(where + str(exc)) from exc
        top = top_nums[i] or 0
        if isinstance(top, bool) or not 0 <= top <= vocab_size:
            raise BadRequest(f"{where}top_logprobs_num must be an integer in [0, {vocab_size}], got {top!r}")
        items.append(GenerateItem(rids[i] or uuid.uuid4().hex, ids, params, bool(logprob_flags[i]), top, start,
                                  bool(routed[i])))
    if stream and is_batch:
        raise BadRequest("stream=true takes a single prompt, not a batch")
    return items, is_batch, stream


def _tokenize(tokenizer: Any | None, text: Any) -> Any:
    if tokenizer is None:
        raise BadRequest("text input needs a tokenizer in the model directory; send input_ids")
    if isinstance(text, str):
        return tokenizer.encode(text, add_special_tokens=False)
    if isinstance(text, list) and all(isinstance(t, str) for t in text):
        return [tokenizer.encode(t, add_special_tokens=False) for t in text]
    raise BadRequest("text must be a string or a list of strings")


def generate_output(req: "Request", weight_version: str, started: float, tokenizer: Any | None,
                    *, segments: bool = True, start: int = 0) -> dict[str, Any]:
    """SGLang's response object for one finished request (also the last chunk of its stream).
    ``segments``: add ``weight_version_segments``, which SGLang does not have (of all the output
    tokens); ``start``: the last chunk of an incremental stream, with the tokens from there on."""
    out = _answer(req, req.output_ids, req.output_logprobs, req.output_top_logprobs, weight_version, started,
                  tokenizer, final=True, start=start)
    if segments and req.version_marks:
        out["meta_info"]["weight_version_segments"] = version_segments(req.version_marks, len(req.output_ids))
    if req.return_routed_experts and req.routed_experts is not None:
        # Only in the finished answer, as SGLang collects them when the request finishes.
        out["meta_info"]["routed_experts"] = routed_experts.encode(req.routed_experts)
    return out


def stream_chunk(req: "Request", output_ids: list[int], logprobs: list[float], top_logprobs: list[TopLogprobs],
                 weight_version: str, started: float, tokenizer: Any | None, *, start: int = 0) -> dict[str, Any]:
    """A chunk of an unfinished request's stream, as SGLang 0.5.17 builds it (tokenizer_manager
    ``_handle_batch_output``): by default cumulative (every token so far, in ``output_ids``,
    ``output_token_logprobs`` and ``text``); ``start`` > 0 (``--incremental-streaming-output``)
    only the tokens from ``start`` on. finish_reason null, ``completion_tokens`` all tokens so far,
    ``weight_version`` the version when the chunk is built."""
    return _answer(req, output_ids, logprobs, top_logprobs, weight_version, started, tokenizer, final=False,
                   start=start)


def _answer(req: "Request", output_ids: list[int], logprobs: list[float], top_logprobs: list[TopLogprobs],
            weight_version: str, started: float, tokenizer: Any | None, *, final: bool, start: int = 0
            ) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason if final else None,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(output_ids),
        "cached_tokens": req.cached_tokens,
        "weight_version": weight_version,
        "e2e_latency": time.monotonic() - started,
    }
    output_ids, logprobs = output_ids[start:], logprobs[start:]
    if req.return_logprob:
        meta["output_token_logprobs"] = [[lp, tok, None] for lp, tok in zip(logprobs, output_ids)]
        meta["input_token_logprobs"] = input_token_logprobs(req) if start == 0 else []
        if req.top_logprobs_num > 0:
            # SGLang's layout (tokenizer_manager ``add_logprob_to_meta_info``): per output token its
            # top_logprobs_num alternatives, most likely first, each [logprob, token_id, text or null].
            meta["output_top_logprobs"] = [[[lp, tok, None] for lp, tok in top] for top in top_logprobs[start:]]
            meta["input_top_logprobs"] = []
    out: dict[str, Any] = {"output_ids": list(output_ids), "meta_info": meta}
    if tokenizer is not None:
        text_ids = output_ids
        matched = (req.finish_reason or {}).get("matched") if final else None
        # SGLang trims a matched stop token from the text (not from output_ids).
        if isinstance(matched, int) and not req.params.no_stop_trim and text_ids:
            text_ids = text_ids[:-1]
        out["text"] = tokenizer.decode(text_ids, skip_special_tokens=req.params.skip_special_tokens)
    return out


def input_token_logprobs(req: "Request") -> list[list[Any]]:
    """SGLang's ``meta_info.input_token_logprobs``: ``[logprob, token_id, null]`` for each input
    position from ``logprob_start_len`` on, the first logprob always null (SGLang pads it: the
    logits before that position were not computed). An incremental stream sends them once, in
    its first chunk; a cumulative one in every chunk."""
    if req.input_logprobs is None:
        return []
    return [[lp, tok, None] for lp, tok in zip(req.input_logprobs, req.input_ids[req.logprob_start_len:])]


def version_segments(marks: list[tuple[int, str]], n_tokens: int) -> list[list[Any]]:
    """``[[version, n], ...]``: how many output tokens, in order, each weight version generated
    (an extension of SGLang's meta_info, whose ``weight_version`` is only the version at the
    end; the rollout records per-token versions from it)."""
    ends = [start for start, _ in marks[1:]] + [n_tokens]
    return [[version, end - start] for (start, version), end in zip(marks, ends) if end > start]
