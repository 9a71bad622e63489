"""Tool calls: messages prepared for a chat template, and calls parsed back out of completions.

Tools are rendered by the model's own chat template (``apply_chat_template(tools=...)``); this
module only adapts OpenAI's message shapes to what HF templates expect and parses the text the
model writes back, for the families the HF bridge supports:

- ``hermes`` (Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  one block per call; the text before the first block is the message content.
- ``llama3_json`` (Llama 3.1-3.3): the whole completion is one JSON object
  ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``), optionally after
  ``<|python_tag|>``, several separated by ``;``; there is no content then.

Text that does not parse as a call stays content: a malformed call is the model's mistake to
learn from, not a server error.

``tool_choice`` required or a named function is enforced by prefilling (`forced_opening`): the
front appends the call's opening in the model's format to the prompt — ``<tool_call>\n`` (a named
function: up to ``{"name": "f", "arguments": ``) — so the model can only go on with a call. Those
tokens are prompt to the engine and in the trajectory, never sampled (loss mask 0), and parsed
with the completion.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Literal

ToolParser = Literal["hermes", "llama3_json", "none"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


class MessageError(ValueError):
    """A message the chat template cannot take; ``param`` is its OpenAI parameter path."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id or new_call_id(),
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }
        if index is not None:  # stream deltas carry the position of the call
            call["index"] = index
        return call


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def choose_parser(chat_template: str | None, model_type: str | None) -> ToolParser:
    """The parser for a model: what its template renders decides, the architecture breaks ties."""
    template = chat_template or ""
    if HERMES_OPEN in template:
        return "hermes"
    if PYTHON_TAG in template or (model_type or "").startswith("llama"):
        return "llama3_json"
    return "hermes"  # Qwen-family default; harmless on text without tool-call markup


def forced_opening(tool_choice: Any, tools: list[dict[str, Any]] | None, parser: ToolParser) -> str:
    """The text that forces a call under the chat path's ``tool_choice`` (required, or
    ``{"type": "function", "function": {"name": ...}}``); "" for auto / none. ``required`` with
    one tool forces that tool by name; with several the model writes the name. ValueError (the
    caller's 400) when it cannot be forced: no tools, or no tool-call format (parser none)."""
    if tool_choice == "required":
        names = [tool.get("function", {}).get("name") for tool in tools or []]
        name = names[0] if len(names) == 1 else None
    elif isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
    else:
        return ""
    if not tools:
        raise ValueError("tool_choice: a required or named tool call needs tools")
    if parser == "hermes":
        return HERMES_OPEN + "\n" + (f'{{"name": {json.dumps(name)}, "arguments": ' if name else "")
    if parser == "llama3_json":
        return f'{{"name": {json.dumps(name)}, "parameters": ' if name else '{"name": "'
    raise ValueError("tool_choice: a required or named tool call needs a tool-call format (--router-tool-parser "
                     "is none)")


def parse_tool_calls(text: str, parser: ToolParser) -> tuple[str | None, list[ToolCall]]:
    """Split a completion into (content, tool calls). No calls: the text is the content."""
    if parser == "hermes":
        return _parse_hermes(text)
    if parser == "llama3_json":
        return _parse_llama3_json(text)
    return text, []


def _parse_hermes(text: str) -> tuple[str | None, list[ToolCall]]:
    start = text.find(HERMES_OPEN)
    if start < 0:
        return text, []
    calls: list[ToolCall] = []
    position = start
    while True:
        open_at = text.find(HERMES_OPEN, position)
        if open_at < 0:
            break
        close_at = text.find(HERMES_CLOSE, open_at)
        if close_at < 0:
            return text, []  # cut off mid-call (length): not a call
        call = _call_from_json(text[open_at + len(HERMES_OPEN):close_at])
        if call is None:
            return text, []
        calls.append(call)
        position = close_at + len(HERMES_CLOSE)
    content = text[:start].strip()
    return (content or None), calls


def _parse_llama3_json(text: str) -> tuple[str | None, list[ToolCall]]:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
        return text, []
    calls: list[ToolCall] = []
    decoder = json.JSONDecoder()
    position = 0
    while position < len(body):
        try:
            value, end = decoder.raw_decode(body, position)
        except json.JSONDecodeError:
            return text, []
        call = _call_from_value(value)
        if call is None:
            return text, []
        calls.append(call)
        position = end
        rest = body[position:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            return text, []  # trailing prose: not a pure call
        position = len(body) - len(rest) + 1
        while position < len(body) and body[position].isspace():
            position += 1
    return None, calls


def _call_from_json(raw: str) -> ToolCall | None:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return _call_from_value(value)


def _call_from_value(value: Any) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(value["name"], arguments)


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI chat messages in the shape HF chat templates read.

    Content given as a list of parts becomes one string (text parts only). A tool call's
    ``arguments`` is a JSON string in OpenAI's API but a mapping in HF templates (they apply
    ``tojson`` to it), so it is decoded here, as SGLang and vLLM do.
    """
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise MessageError(f"{where} must be an object with a 'role'", where)
        message = dict(message)
        message["content"] = _content_text(message.get("content"), f"{where}.content")
        if message.get("tool_calls"):
            message["tool_calls"] = [_template_call(call, f"{where}.tool_calls[{k}]")
                                     for k, call in enumerate(message["tool_calls"])]
        out.append(message)
    return out


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessageError(f"{where}[{k}]: only text content parts are supported, got {kind!r}", where)
            texts.append(part["text"])
        return "".join(texts)
    raise MessageError(f"{where} must be a string or a list of text parts", where)


def _template_call(call: Any, where: str) -> dict[str, Any]:
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        raise MessageError(f"{where} must be an object with a 'function'", where)
    function = dict(call["function"])
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise MessageError(f"{where}.function.arguments is not valid JSON: {error}", where) from None
    function["arguments"] = arguments
    return {**call, "function": function}
