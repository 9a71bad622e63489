"""OpenAI's Responses API as the front serves it: request parsing, conversation items, shapes.

Pure JSON in, JSON out. A request's ``input`` (text or items) plus the items of the responses
it continues (``previous_response_id``) become chat messages for the model's chat template:
message items keep their role (``developer`` is rendered as ``system``: HF templates know no
developer role), ``function_call`` items become the assistant message's ``tool_calls`` and
``function_call_output`` items ``tool`` messages, as the chat path renders them. One completion
answers a request; its text becomes a ``message`` output item and any parsed tool calls
``function_call`` items.

Beyond OpenAI's fields every response carries the exact tokens (extensions, ignored by clients
that do not know them, read as ``response.model_extra[...]``): ``prompt_token_ids``,
``token_ids``, ``token_logprobs``, ``token_weight_versions`` and ``weight_version`` (of the last
token). Built-in tools (web search, file search, computer use, MCP, ...), non-text input parts,
structured-output formats, ``background``, ``conversation``, ``prompt``
templates and ``truncation: auto`` are refused with a 400 naming the field.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from actors.router.openai_protocol import (MAX_TOP_LOGPROBS, ChoiceOut, OpenAIError, Sampling, _sampling,
                                           logprob_entries, token_fields, top_logprobs_field)

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Include values that ask for nothing this server produces (there is no reasoning to encrypt).
_HARMLESS_INCLUDES = {LOGPROBS_INCLUDE, "reasoning.encrypted_content"}
# Fields of chat completions that ``_sampling`` would honour but that Responses does not have.
_NOT_RESPONSES = ("n", "max_tokens", "response_format")
_REFUSED = {
    "background": "background responses are not supported",
    "conversation": "conversations are not supported; continue with previous_response_id",
    "prompt": "prompt templates are not supported",
}
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class ResponsesRequest:
    items: list[dict[str, Any]]  # this request's input, as normalized items
    instructions: str | None
    tools: list[dict[str, Any]]  # as given (Responses' flat shape), echoed in the response
    chat_tools: list[dict[str, Any]] | None  # chat-shaped, for the template; None: not rendered
    tool_choice: Any  # as given, echoed
    chat_tool_choice: Any  # the chat path's form (forced_opening reads it)
    parse_tools: bool
    sampling: Sampling
    previous_response_id: str | None
    store: bool
    metadata: dict[str, Any] | None
    parallel_tool_calls: bool
    template_kwargs: dict[str, Any]


def parse_responses(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    for name, reason in _REFUSED.items():
        if body.get(name):
            raise OpenAIError(reason, param=name)
    if body.get("truncation") not in (None, "disabled"):
        raise OpenAIError("truncation 'auto' is not supported: the whole conversation is sent", param="truncation")
    top_logprobs = top_logprobs_field(body, "top_logprobs", MAX_TOP_LOGPROBS)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and any(v is not None for v in reasoning.values()):
        raise OpenAIError("reasoning options are not supported by this model server", param="reasoning")
    _check_text_format(body.get("text"))
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise OpenAIError("include must be a list of strings", param="include")
    for value in include:
        if value not in _HARMLESS_INCLUDES:
            raise OpenAIError(f"include {value!r} is not supported (only {LOGPROBS_INCLUDE!r})", param="include")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise OpenAIError("instructions must be a string", param="instructions")
    tools = _tools(body.get("tools"))
    names = {tool["name"] for tool in tools}
    tool_choice = body.get("tool_choice", "auto")
    chat_choice = _tool_choice(tool_choice, names)
    max_output = body.get("max_output_tokens")
    if max_output is not None and (not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 1):
        raise OpenAIError(f"max_output_tokens must be a positive integer, got {max_output!r}",
                          param="max_output_tokens")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise OpenAIError("previous_response_id must be a response id", param="previous_response_id")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise OpenAIError("metadata must be an object", param="metadata")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise OpenAIError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    # top_logprobs > 0 shows the logprobs (with their alternatives) even without the include.
    sampling = _sampling({k: v for k, v in body.items() if k not in _NOT_RESPONSES}, max_output,
                         LOGPROBS_INCLUDE in include or top_logprobs > 0, top_logprobs)
    use_tools = bool(tools) and chat_choice != "none"
    chat_tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
                  for t in tools]
    return ResponsesRequest(
        items=input_items(body.get("input")), instructions=instructions, tools=tools,
        chat_tools=chat_tools if use_tools else None, tool_choice=tool_choice,
        chat_tool_choice=chat_choice if use_tools else "none", parse_tools=use_tools,
        sampling=sampling, previous_response_id=previous, store=body.get("store", True) is not False,
        metadata=metadata, parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
        template_kwargs=template_kwargs)


def _check_text_format(text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise OpenAIError("text must be an object", param="text")
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type", "text") != "text":
        raise OpenAIError(f"text.format {fmt.get('type')!r} is not supported (only text)", param="text.format")


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise OpenAIError("tools must be a list", param="tools")
    out = []
    for k, tool in enumerate(tools):
        where = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise OpenAIError(f"{where} must be an object", param=where)
        kind = tool.get("type")
        if kind != "function":
            raise OpenAIError(f"{where}: tool type {kind!r} is not supported; only function tools "
                              "(built-in tools such as web_search need OpenAI's servers)", param=f"{where}.type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise OpenAIError(f"{where}.name must be a non-empty string", param=f"{where}.name")
        if tool.get("parameters") is not None and not isinstance(tool["parameters"], dict):
            raise OpenAIError(f"{where}.parameters must be a JSON schema object", param=f"{where}.parameters")
        out.append(tool)
    return out


def _tool_choice(choice: Any, names: set[str]) -> str | dict[str, Any]:
    """The chat path's form of a Responses ``tool_choice``: auto, none, required or a named function."""
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if name not in names:
            raise OpenAIError(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise OpenAIError(f"tool_choice must be auto, none, required or {{'type': 'function', 'name': ...}}, "
                      f"got {choice!r}", param="tool_choice")


# ----- input items -----------------------------------------------------------------------------


def input_items(value: Any) -> list[dict[str, Any]]:
    """``input`` as a list of normalized items: ``{"type": "message", "role", "content": str}``,
    ``{"type": "function_call", "call_id", "name", "arguments": str}`` or
    ``{"type": "function_call_output", "call_id", "output": str}``."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise OpenAIError("input must be a string or a non-empty list of items", param="input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise OpenAIError(f"{where} must be an object", param=where)
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise OpenAIError(f"{where}.role must be user, system, developer or assistant, got {role!r}",
                              param=f"{where}.role")
        return {"type": "message", "role": role, "content": _text(item.get("content"), f"{where}.content")}
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise OpenAIError(f"{where}.{name} must be a string", param=f"{where}.{name}")
        arguments = item["arguments"]
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise OpenAIError(f"{where}.arguments is not valid JSON: {error}", param=f"{where}.arguments") from None
        if not isinstance(decoded, dict):
            raise OpenAIError(f"{where}.arguments must be a JSON object", param=f"{where}.arguments")
        return {"type": "function_call", "call_id": item["call_id"], "name": item["name"], "arguments": arguments}
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise OpenAIError(f"{where}.call_id must be a string", param=f"{where}.call_id")
        return {"type": "function_call_output", "call_id": item["call_id"],
                "output": _text(item.get("output"), f"{where}.output")}
    raise OpenAIError(f"{where}: input item type {kind!r} is not supported (message, function_call, "
                      "function_call_output)", param=f"{where}.type")


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(f"{where} must be a string or a list of text parts", param=where)
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise OpenAIError(f"{where}[{k}]: only text content parts are supported, got {kind!r}",
                              param=f"{where}[{k}]")
    return "".join(texts)


def chat_messages(instructions: str | None, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized items as chat messages in the shape HF chat templates read (tool-call
    arguments as mappings), with ``instructions`` first as a system message."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    names: dict[str, str] = {}  # call_id -> function name, for templates that render it
    for item in items:
        if item["type"] == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": item["content"]})
        elif item["type"] == "function_call":
            names[item["call_id"]] = item["name"]
            arguments = json.loads(item["arguments"]) if item["arguments"].strip() else {}
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:  # a call with no text before it
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            message = {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
            if item["call_id"] in names:
                message["name"] = names[item["call_id"]]
            messages.append(message)
    return messages


# ----- output ----------------------------------------------------------------------------------


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def incomplete(choice: ChoiceOut) -> bool:
    return choice.completion.finish_type == "length"


def output_items(choice: ChoiceOut, logprobs: bool) -> list[dict[str, Any]]:
    """The output items of one completion: its text as a message (when it has text or no tool
    calls), then one ``function_call`` per parsed call."""
    items: list[dict[str, Any]] = []
    status = "incomplete" if incomplete(choice) else "completed"
    if choice.text or not choice.tool_calls:
        scored = logprobs and not choice.tool_calls  # with calls the tokens are not all text
        part = output_text(choice.text, logprob_entries(choice.token_texts, choice.completion.logprobs,
                                                        choice.top_logprobs) if scored else [])
        items.append({"id": item_id("msg"), "type": "message", "role": "assistant", "status": status,
                      "content": [part]})
    for call in choice.tool_calls:
        openai_call = call.to_openai()
        items.append({"id": item_id("fc"), "type": "function_call", "status": "completed",
                      "call_id": openai_call["id"], "name": call.name,
                      "arguments": openai_call["function"]["arguments"]})
    return items


def output_text(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def as_input_items(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output items in their normalized input form, for the conversation a later request continues."""
    normalized = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            normalized.append({"type": "message", "role": "assistant", "content": text})
        else:
            normalized.append({k: item[k] for k in ("type", "call_id", "name", "arguments")})
    return normalized


def response_object(response_id: str, model: str, request: ResponsesRequest, created: float, *,
                    output: list[dict[str, Any]], status: str, choice: ChoiceOut | None = None,
                    prompt_ids: list[int] | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``Response`` object; ``choice`` None: still in progress (or failed), no usage yet."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created, "status": status, "model": model,
        "output": output, "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions, "metadata": request.metadata or {},
        "parallel_tool_calls": request.parallel_tool_calls, "tool_choice": request.tool_choice,
        "tools": request.tools, "temperature": sampling.params.get("temperature"),
        "top_p": sampling.params.get("top_p"), "max_output_tokens": sampling.max_tokens,
        "top_logprobs": sampling.top_logprobs,
        "previous_response_id": request.previous_response_id, "store": request.store, "background": False,
        "reasoning": {"effort": None, "summary": None}, "text": {"format": {"type": "text"}},
        "truncation": "disabled", "usage": None, "user": None,
        "completed_at": time.time() if status == "completed" else None,
    }
    if choice is not None and prompt_ids is not None:
        body["usage"] = usage(prompt_ids, choice)
        body |= {"prompt_token_ids": prompt_ids, "weight_version": choice.completion.weight_version}
        body |= token_fields(choice.completion, 0, None)
    return body


def usage(prompt_ids: list[int], choice: ChoiceOut) -> dict[str, Any]:
    output = len(choice.completion.output_ids)
    return {"input_tokens": len(prompt_ids),
            "input_tokens_details": {"cached_tokens": choice.completion.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(prompt_ids) + output}


def error_object(status: int, message: str) -> dict[str, Any]:
    """``Response.error`` of a failed response (OpenAI's codes: server_error or invalid_prompt)."""
    return {"code": "invalid_prompt" if 400 <= status < 500 else "server_error", "message": message}
