"""Anthropic's Messages API as the front serves it: request parsing, answer and stream shapes.

Pure JSON in, JSON out. A Messages request becomes the same chat the OpenAI path renders:
``system`` the first message, text blocks joined, an assistant's ``tool_use`` blocks its tool
calls, a user's ``tool_result`` blocks one ``tool`` message each (before the user's text, in
block order, as SGLang's own Anthropic adapter does), and ``tools`` OpenAI-style functions for
the model's chat template. ``tool_choice`` maps to the chat path's vocabulary (``any`` →
``required``, ``tool`` → a named function), which the front enforces by forcing the call's opening.

Beyond Anthropic's fields every answer carries the exact tokens (extensions, ignored by clients
that do not know them): top-level ``prompt_token_ids``, ``token_ids``, ``token_logprobs``,
``token_weight_versions`` and ``weight_version`` (of the last token). A stream carries
``prompt_token_ids`` in ``message_start``'s message and the token lists in ``message_delta``.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from actors.router.completion import Completion
from actors.router.openai_protocol import OpenAIError, Sampling
from actors.router.tool_calls import MessageError, ToolCall, template_messages

MESSAGES_PATH = "/v1/messages"

# Error type per HTTP status, as Anthropic names them (SGLang's adapter uses the same table).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "request_timeout_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
                504: "api_error"}

# Extension sampling fields (``extra_body``), with SGLang's names.
_EXTENSIONS = {"min_p": float, "repetition_penalty": float, "stop_token_ids": list, "ignore_eos": bool}
_REFUSED = {"thinking": "extended thinking", "output_config": "output_config", "output_format": "structured output",
            "citations": "citations"}


def is_messages_path(path: str) -> bool:
    """``/v1/messages``, ``/v1/messages/count_tokens`` and their ``/sessions/<id>/`` forms."""
    return path.endswith(MESSAGES_PATH) or path.endswith(MESSAGES_PATH + "/count_tokens")


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error envelope; the type follows the status."""
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message}}


@dataclass
class MessagesRequest:
    model: str
    messages: list[dict[str, Any]]  # template-ready chat messages (system first)
    tools: list[dict[str, Any]] | None  # OpenAI-style functions to render; None: no tools
    tool_choice: str | dict[str, Any]  # the chat path's: auto / none / required / {"type": "function", ...}
    sampling: Sampling


def parse_messages(body: Any, *, count_only: bool = False) -> MessagesRequest:
    """A Messages (or count_tokens) request; a bad field is one 400 naming it."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise OpenAIError("model: field required (a string)", param="model")
    for name, what in _REFUSED.items():
        value = body.get(name)
        if value is not None and not (name == "thinking" and isinstance(value, dict)
                                      and value.get("type") == "disabled"):
            raise OpenAIError(f"{name}: {what} is not supported by this server", param=name)
    chat = _system(body.get("system")) + _conversation(body.get("messages"))
    try:
        messages = template_messages(chat)
    except MessageError as error:  # our own conversion's shape: not expected, but named
        raise OpenAIError(str(error), param="messages") from None
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    rendered = tools if tools and tool_choice != "none" else None
    sampling = Sampling() if count_only else _sampling(body)
    return MessagesRequest(model, messages, rendered, tool_choice, sampling)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None or system == "" or system == []:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        return [{"role": "system", "content": "\n".join(_text_blocks(system, "system"))}]
    raise OpenAIError("system: must be a string or a list of text blocks", param="system")


def _text_blocks(blocks: list[Any], where: str) -> list[str]:
    texts = []
    for k, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise OpenAIError(f"{where}.{k}: only text blocks are supported here, got {kind!r}", param=where)
        texts.append(block["text"])
    return texts


def _conversation(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages: field required (a non-empty list)", param="messages")
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise OpenAIError(f"{where}.role: must be 'user' or 'assistant'", param=where)
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif isinstance(content, list):
            out += _assistant(content, where) if role == "assistant" else _user(content, where)
        else:
            raise OpenAIError(f"{where}.content: must be a string or a list of content blocks", param=where)
    return out


def _assistant(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    texts, calls = [], []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            name, arguments = block.get("name"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise OpenAIError(f"{where}.content.{k}: a tool_use block needs a 'name' and an 'input' object",
                                  param=where)
            # Arguments stay a mapping: HF templates apply ``tojson`` to them.
            calls.append({"id": block.get("id", ""), "type": "function",
                          "function": {"name": name, "arguments": arguments}})
        else:
            raise OpenAIError(f"{where}.content.{k}: an assistant turn takes text and tool_use blocks, got "
                              f"{kind or type(block).__name__!r}", param=where)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for k, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result":
            if texts:  # text before a result stays before it
                out.append({"role": "user", "content": "".join(texts)})
                texts = []
            out.append({"role": "tool", "tool_call_id": block.get("tool_use_id", ""),
                        "content": _result_text(block.get("content"), f"{where}.content.{k}")})
            # is_error is accepted; the template has no way to mark it (SGLang's adapter drops it too).
        else:
            raise OpenAIError(f"{where}.content.{k}: a user turn takes text and tool_result blocks, got "
                              f"{kind or type(block).__name__!r}", param=where)
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _result_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_blocks(content, where + ".content"))
    raise OpenAIError(f"{where}.content: a tool_result's content must be a string or text blocks", param=where)


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise OpenAIError("tools: must be a list of tools", param="tools")
    out = []
    for k, tool in enumerate(tools):
        where = f"tools.{k}"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise OpenAIError(f"{where}.name: field required", param="tools")
        if tool.get("type") not in (None, "custom"):
            raise OpenAIError(f"{where}: server tools ({tool['type']!r}) are not supported; give custom tools "
                              "with an input_schema", param="tools")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise OpenAIError(f"{where}.input_schema: field required (a JSON schema object)", param="tools")
        out.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                                     "parameters": schema}})
    return out


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any]:
    if choice is None:
        return "auto" if tools else "none"
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise OpenAIError(f"tool_choice.type: must be auto, any, tool or none, got {kind!r}", param="tool_choice")
    if kind in ("auto", "none"):
        return kind if tools else "none"
    if not tools:
        raise OpenAIError(f"tool_choice: type {kind!r} needs tools", param="tool_choice")
    if kind == "any":
        return "required"
    name = choice.get("name")
    if name not in [tool["function"]["name"] for tool in tools]:
        raise OpenAIError(f"tool_choice.name: {name!r} is not one of the tools", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def _sampling(body: dict[str, Any]) -> Sampling:
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise OpenAIError("max_tokens: field required", param="max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise OpenAIError(f"max_tokens: must be a positive integer, got {max_tokens!r}", param="max_tokens")
    stops = body.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise OpenAIError("stop_sequences: must be a list of strings", param="stop_sequences")
    params: dict[str, Any] = {"temperature": _number(body, "temperature", 1.0, 0.0, 1.0),
                              "top_p": _number(body, "top_p", 1.0, 0.0, 1.0)}
    top_k = body.get("top_k")
    if top_k is not None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
            raise OpenAIError(f"top_k: must be a non-negative integer, got {top_k!r}", param="top_k")
        params["top_k"] = top_k if top_k > 0 else -1  # SGLang's "no top-k" is -1
    for name, kind in _EXTENSIONS.items():  # SGLang's names, sent as extra_body
        value = body.get(name)
        if value is None:
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise OpenAIError(f"{name}: must be {kind.__name__}, got {value!r}", param=name)
        params[name] = value
    return Sampling(n=1, max_tokens=max_tokens, stop=tuple(s for s in stops if s), params=params,
                    logprobs=False, stream=bool(body.get("stream")))


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise OpenAIError(f"{name}: must be a number in [{low:g}, {high:g}], got {value!r}", param=name)
    return float(value)


# ----- answers ----------------------------------------------------------------------------------


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def new_tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def stop_of(completion: Completion, calls: list[ToolCall], stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished completion."""
    if calls:
        return "tool_use", None
    if completion.finish_type == "length":
        return "max_tokens", None
    matched = (completion.finish_reason or {}).get("matched")
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def content_blocks(text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """The answer's blocks: the text (if any, or if nothing else) then one ``tool_use`` per call."""
    blocks: list[dict[str, Any]] = []
    if text or not calls:
        blocks.append({"type": "text", "text": text})
    for call in calls:
        blocks.append({"type": "tool_use", "id": call.id or new_tool_use_id(), "name": call.name,
                       "input": call.arguments})
    return blocks


def message_response(message_id: str, model: str, prompt_ids: list[int], completion: Completion, text: str,
                     calls: list[ToolCall], stops: tuple[str, ...]) -> dict[str, Any]:
    stop_reason, stop_sequence = stop_of(completion, calls, stops)
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(text, calls), "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": usage(prompt_ids, completion), "prompt_token_ids": prompt_ids, **token_fields(completion)}


def usage(prompt_ids: list[int], completion: Completion | None) -> dict[str, Any]:
    cached = completion.cached_tokens if completion is not None else 0
    return {"input_tokens": len(prompt_ids), "output_tokens": len(completion.output_ids) if completion else 0,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def token_fields(completion: Completion) -> dict[str, Any]:
    return {"token_ids": completion.output_ids, "token_logprobs": completion.logprobs,
            "token_weight_versions": completion.weight_versions, "weight_version": completion.weight_version}


# ----- stream events ----------------------------------------------------------------------------


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event with its ``event:`` line: Anthropic's client skips events without one."""
    return f"event: {payload['type']}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


def message_start(message_id: str, model: str, prompt_ids: list[int]) -> dict[str, Any]:
    message = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": usage(prompt_ids, None),
               "prompt_token_ids": prompt_ids}
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    # Opened empty, as Anthropic does: the text / input comes in deltas (clients append them).
    block = {**block, "input": {}} if block["type"] == "tool_use" else {**block, "text": ""}
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}


def input_json_delta(index: int, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments, ensure_ascii=False)}}


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(completion: Completion, calls: list[ToolCall], stops: tuple[str, ...]) -> dict[str, Any]:
    stop_reason, stop_sequence = stop_of(completion, calls, stops)
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": len(completion.output_ids)}, **token_fields(completion)}


PING = {"type": "ping"}
MESSAGE_STOP = {"type": "message_stop"}
