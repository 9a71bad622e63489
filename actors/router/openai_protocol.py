"""OpenAI's chat / completions API as the front serves it: request parsing, response shapes.

Pure JSON in, JSON out. Beyond OpenAI's fields every answer carries the exact tokens
(extensions, ignored by clients that do not know them): top-level ``prompt_token_ids`` and
``weight_version`` (of the last token), per choice ``token_ids``, ``token_logprobs`` and
``token_weight_versions``. ``top_logprobs`` (chat, 0..20 with ``logprobs: true``) and completions'
``logprobs`` (0..5) are each token's most likely alternatives, from the engine (SGLang's
``top_logprobs_num``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from actors.router.completion import Completion
from actors.router.tool_calls import MessageError, ToolCall, template_messages
from slime_async.token_ids import out_of_vocabulary

MAX_N = 128
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat's top_logprobs (and Responses')
MAX_COMPLETIONS_LOGPROBS = 5  # OpenAI's bound for completions' logprobs

# Extension sampling fields a client may send (``extra_body``), with SGLang's names.
_PASSTHROUGH = {"top_k": int, "min_p": float, "repetition_penalty": float, "stop_token_ids": list,
                "ignore_eos": bool}


class OpenAIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type, param, code

    def body(self) -> dict[str, Any]:
        return error_body(str(self), self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class Sampling:
    """What chat and completions requests share."""

    n: int = 1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)  # engine sampling params (SGLang's names)
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per token (with logprobs)
    stream: bool = False
    include_usage: bool = False
    no_stop_trim: bool = False
    skip_special_tokens: bool = True


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    template_kwargs: dict[str, Any]
    sampling: Sampling
    tool_choice: Any = "auto"  # auto / none / required / {"type": "function", "function": {"name": ...}}


@dataclass
class CompletionsRequest:
    prompts: list[str | list[int]]
    echo: bool
    sampling: Sampling


def parse_chat(body: Any) -> ChatRequest:
    body = _object(body)
    try:
        messages = template_messages(body.get("messages"))
    except MessageError as error:
        raise OpenAIError(str(error), param=error.param) from None
    tools = body.get("tools") or None
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise OpenAIError("tools must be a list of objects", param="tools")
    tool_choice = body.get("tool_choice", "auto" if tools else "none")
    if tool_choice not in ("auto", "none", "required") and not _names_a_tool(tool_choice, tools):
        raise OpenAIError(f"tool_choice must be auto, none, required or {{'type': 'function', 'function': "
                          f"{{'name': ...}}}} naming one of the tools, got {tool_choice!r}", param="tool_choice")
    if tool_choice == "required" and not tools:
        raise OpenAIError("tool_choice required needs tools", param="tool_choice")
    top_logprobs = top_logprobs_field(body, "top_logprobs", MAX_TOP_LOGPROBS)
    if top_logprobs and not body.get("logprobs"):
        raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise OpenAIError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    sampling = _sampling(body, max_tokens, bool(body.get("logprobs")), top_logprobs)
    use_tools = bool(tools) and tool_choice != "none"
    return ChatRequest(messages, tools if use_tools else None, use_tools, template_kwargs, sampling,
                       tool_choice if use_tools else "none")


def parse_completions(body: Any, vocab_size: int | None = None) -> CompletionsRequest:
    """A token-id prompt outside ``vocab_size`` is refused here: it would kill an SGLang engine."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _is_ids(prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts = list(prompt)
    else:
        raise OpenAIError("prompt must be a string, a list of strings, or token ids", param="prompt")
    for i, ids in enumerate(prompts):
        name = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
        problem = None if isinstance(ids, str) else out_of_vocabulary(ids, vocab_size, name)
        if problem:
            raise OpenAIError(problem, param="prompt")
    for name in ("suffix",):
        if body.get(name):
            raise OpenAIError(f"{name} is not supported", param=name)
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise OpenAIError("best_of is not supported", param="best_of")
    logprobs = body.get("logprobs")
    top = top_logprobs_field(body, "logprobs", MAX_COMPLETIONS_LOGPROBS)
    echo = bool(body.get("echo"))
    if echo and logprobs is not None:
        raise OpenAIError("echo with logprobs is not supported (no prompt logprobs)", param="echo")
    sampling = _sampling(body, body.get("max_tokens", 16), logprobs is not None, top)
    return CompletionsRequest(prompts, echo, sampling)


def top_logprobs_field(body: dict[str, Any], name: str, most: int) -> int:
    """An alternatives-per-token count (chat's and Responses' ``top_logprobs``, completions'
    ``logprobs``): an integer in [0, most]; absent or null is 0."""
    value = body.get(name)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        raise OpenAIError(f"{name} must be an integer in [0, {most}], got {value!r}", param=name)
    return value


def _sampling(body: dict[str, Any], max_tokens: Any, logprobs: bool, top_logprobs: int = 0) -> Sampling:
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise OpenAIError(f"n must be an integer in [1, {MAX_N}], got {n!r}", param="n")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0):
        raise OpenAIError(f"max_tokens must be a non-negative integer, got {max_tokens!r}", param="max_tokens")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise OpenAIError("stop must be a string or a list of strings", param="stop")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        raise OpenAIError("response_format other than text is not supported", param="response_format")
    params: dict[str, Any] = {
        "temperature": _number(body, "temperature", 1.0),
        "top_p": _number(body, "top_p", 1.0),
    }
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name):
            params[name] = _number(body, name, 0.0)
    if body.get("logit_bias"):
        params["logit_bias"] = body["logit_bias"]
    if body.get("seed") is not None:
        params["sampling_seed"] = body["seed"]
    if body.get("min_tokens"):
        params["min_new_tokens"] = body["min_tokens"]
    for name, kind in _PASSTHROUGH.items():
        if body.get(name) is not None:
            value = body[name]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise OpenAIError(f"{name} must be {kind.__name__}, got {value!r}", param=name)
            params[name] = value
    stream_options = body.get("stream_options") or {}
    return Sampling(
        n=n, max_tokens=max_tokens, stop=stops, params=params, logprobs=logprobs, top_logprobs=top_logprobs,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
        no_stop_trim=bool(body.get("no_stop_trim")), skip_special_tokens=body.get("skip_special_tokens", True) is not False,
    )


# ----- responses --------------------------------------------------------------------------------


@dataclass
class ChoiceOut:
    """One finished (or streaming) choice, in the front's terms."""

    completion: Completion
    text: str  # content (or completion text), stop-trimmed
    tool_calls: list[ToolCall] = field(default_factory=list)
    token_texts: list[str] = field(default_factory=list)  # for logprobs
    top_logprobs: list[list[tuple[str, float]]] = field(default_factory=list)  # per token: (text, logprob)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def finish_reason(choice: ChoiceOut) -> str:
    if choice.tool_calls:
        return "tool_calls"
    return "length" if choice.completion.finish_type == "length" else "stop"


def chat_response(request_id: str, model: str, prompt_ids: list[int], choices: list[ChoiceOut],
                  logprobs: bool) -> dict[str, Any]:
    out = []
    for index, choice in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        if choice.tool_calls:
            message["content"] = choice.text or None
            message["tool_calls"] = [call.to_openai() for call in choice.tool_calls]
        entry = {"index": index, "message": message, "finish_reason": finish_reason(choice),
                 "logprobs": _chat_logprobs(choice, 0, None) if logprobs else None}
        out.append(entry | token_fields(choice.completion, 0, None))
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": out, "usage": usage(prompt_ids, choices), **_request_fields(prompt_ids, choices)}


def chat_chunk(request_id: str, model: str, index: int, delta: dict[str, Any], *, finish: str | None = None,
               choice: ChoiceOut | None = None, tokens: tuple[int, int] | None = None,
               logprobs: bool = False) -> dict[str, Any]:
    """One SSE chunk of a streaming chat answer; ``tokens`` is the (start, end) of the new ids."""
    entry: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
    if choice is not None and tokens is not None:
        entry |= token_fields(choice.completion, *tokens)
        if logprobs:
            entry["logprobs"] = _chat_logprobs(choice, *tokens)
    return {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [entry]}


def completions_response(request_id: str, model: str, prompts: list[list[int]], choices: list[ChoiceOut],
                         n: int, logprobs: bool) -> dict[str, Any]:
    out = []
    for index, choice in enumerate(choices):
        entry = {"index": index, "text": choice.text, "finish_reason": finish_reason(choice),
                 "logprobs": _completion_logprobs(choice, 0, None) if logprobs else None}
        out.append(entry | token_fields(choice.completion, 0, None))
    response = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
                "choices": out, "usage": usage([t for p in prompts for t in p], choices)}
    if len(prompts) == 1:
        response |= _request_fields(prompts[0], choices)
    else:  # one prompt per n consecutive choices
        response["prompt_token_ids"] = prompts
    return response


def completions_chunk(request_id: str, model: str, index: int, text: str, *, finish: str | None = None,
                      choice: ChoiceOut | None = None, tokens: tuple[int, int] | None = None,
                      logprobs: bool = False) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "text": text, "finish_reason": finish, "logprobs": None}
    if choice is not None and tokens is not None:
        entry |= token_fields(choice.completion, *tokens)
        if logprobs:
            entry["logprobs"] = _completion_logprobs(choice, *tokens)
    return {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [entry]}


def usage_chunk(request_id: str, model: str, object_name: str, prompt_ids: list[int],
                choices: list[ChoiceOut]) -> dict[str, Any]:
    return {"id": request_id, "object": object_name, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage(prompt_ids, choices)}


def models_response(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "slime-async"}]}


def token_fields(completion: Completion, start: int, end: int | None) -> dict[str, Any]:
    return {"token_ids": completion.output_ids[start:end], "token_logprobs": completion.logprobs[start:end],
            "token_weight_versions": completion.weight_versions[start:end]}


def usage(prompt_ids: list[int], choices: list[ChoiceOut]) -> dict[str, Any]:
    completion_tokens = sum(len(c.completion.output_ids) for c in choices)
    cached = max((c.completion.cached_tokens for c in choices), default=0)
    return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached}}


def _request_fields(prompt_ids: list[int], choices: list[ChoiceOut]) -> dict[str, Any]:
    versions = [c.completion.weight_version for c in choices if c.completion.weight_version is not None]
    return {"prompt_token_ids": prompt_ids, "weight_version": versions[-1] if versions else None}


def _chat_logprobs(choice: ChoiceOut, start: int, end: int | None) -> dict[str, Any]:
    return {"content": logprob_entries(choice.token_texts[start:end], choice.completion.logprobs[start:end],
                                       choice.top_logprobs[start:end])}


def logprob_entries(token_texts: list[str], logprobs: list[float], tops: list[list[tuple[str, float]]]
                    ) -> list[dict[str, Any]]:
    """OpenAI's per-token logprob objects (chat's ``logprobs.content``, Responses'
    ``output_text.logprobs``): token, logprob, UTF-8 bytes and its top alternatives (``tops``:
    per token (text, logprob) pairs, most likely first; empty when none were asked for)."""
    tops = tops or [[] for _ in token_texts]
    return [{"token": text, "logprob": logprob, "bytes": list(text.encode()),
             "top_logprobs": [{"token": alt, "logprob": alt_logprob, "bytes": list(alt.encode())}
                              for alt, alt_logprob in top]}
            for text, logprob, top in zip(token_texts, logprobs, tops)]


def _completion_logprobs(choice: ChoiceOut, start: int, end: int | None) -> dict[str, Any]:
    texts = choice.token_texts[start:end]
    offsets, position = [], sum(len(t) for t in choice.token_texts[:start])
    for text in texts:
        offsets.append(position)
        position += len(text)
    tops = None
    if choice.top_logprobs:  # one {text: logprob} per token; of alternatives with one text the likeliest
        tops = [_first_per_text(top) for top in choice.top_logprobs[start:end]]
    return {"tokens": texts, "token_logprobs": choice.completion.logprobs[start:end], "top_logprobs": tops,
            "text_offset": offsets}


def _names_a_tool(choice: Any, tools: list[dict[str, Any]] | None) -> bool:
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(choice.get("function"), dict):
        return False
    name = choice["function"].get("name")
    return any((tool.get("function") or {}).get("name") == name for tool in tools or [])


def _first_per_text(top: list[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for text, logprob in top:
        out.setdefault(text, logprob)
    return out


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    return body


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise OpenAIError(f"{name} must be a number, got {value!r}", param=name)
    return float(value)
