"""Contract tests of the Responses API's pure parts against hand-written expected values: input
items as the Agents SDK and the ``openai`` client send them, the chat messages they render as,
output items, and the bounded store behind ``previous_response_id``."""

import pytest

from actors.router.completion import Completion
from actors.router.openai_protocol import ChoiceOut, OpenAIError
from actors.router.responses_protocol import as_input_items, chat_messages, input_items, output_items, parse_responses
from actors.router.responses_store import ResponseStore, StoredResponse
from actors.router.tool_calls import ToolCall


def test_items_as_the_sdk_sends_them_are_normalized():
    items = input_items([
        {"role": "user", "content": "2 + 3?"},  # EasyInputMessage: no type
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be "},
                                                             {"type": "input_text", "text": "brief."}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Adding.", "annotations": [], "logprobs": []}]},
        {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 2}',
         "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ])
    assert items == [
        {"type": "message", "role": "user", "content": "2 + 3?"},
        {"type": "message", "role": "developer", "content": "Be brief."},
        {"type": "message", "role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 2}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]


def test_items_render_as_chat_messages_with_instructions_first_and_calls_on_the_assistant_message():
    items = input_items([
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "function_call_output", "call_id": "c9", "output": "?"},
    ])
    assert chat_messages("Be brief.", items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},  # developer: HF templates know no such role
        {"role": "user", "content": "2 + 3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5", "name": "add"},
        {"role": "tool", "tool_call_id": "c9", "content": "?"},  # unknown call: no name to add
    ]


def test_a_call_with_no_text_before_it_is_an_assistant_message_of_its_own():
    items = input_items([{"role": "user", "content": "x"},
                         {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}])
    assert chat_messages(None, items)[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}


def _choice(text, calls=(), finish="stop"):
    return ChoiceOut(Completion([7, 8], [-0.5, -0.25], ["1", "1"], {"type": finish}), text, list(calls), ["a", "b"])


def test_text_and_calls_become_a_message_then_function_call_items_that_read_back_as_input():
    output = output_items(_choice("Adding.", [ToolCall("add", {"a": 2}, id="call_x")]), logprobs=True)
    message, call = output
    assert message["type"] == "message" and message["status"] == "completed"
    assert message["content"] == [{"type": "output_text", "text": "Adding.", "annotations": [], "logprobs": []}]
    assert {k: call[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call", "call_id": "call_x", "name": "add", "arguments": '{"a": 2}', "status": "completed"}
    assert as_input_items(output) == [
        {"type": "message", "role": "assistant", "content": "Adding."},
        {"type": "function_call", "call_id": "call_x", "name": "add", "arguments": '{"a": 2}'}]


def test_a_call_alone_has_no_message_and_a_cut_off_text_is_incomplete_with_its_logprobs():
    assert [item["type"] for item in output_items(_choice("", [ToolCall("f", {})]), logprobs=False)] == [
        "function_call"]
    [message] = output_items(_choice("ab", finish="length"), logprobs=True)
    assert message["status"] == "incomplete"
    assert message["content"][0]["logprobs"] == [
        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": []},
        {"token": "b", "logprob": -0.25, "bytes": [98], "top_logprobs": []}]


def test_parsing_maps_tools_and_sampling_to_the_chat_paths_shapes():
    request = parse_responses({"input": "hi", "max_output_tokens": 5, "temperature": 0, "top_p": 0.5,
                               "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                               "include": ["message.output_text.logprobs"], "top_k": 3})
    assert request.chat_tools == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert request.parse_tools and request.store and request.sampling.logprobs and request.sampling.n == 1
    assert request.sampling.max_tokens == 5
    assert request.sampling.params == {"temperature": 0.0, "top_p": 0.5, "top_k": 3}
    none = parse_responses({"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"})
    assert none.chat_tools is None and not none.parse_tools


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]}, "input[0].arguments"),
    ({"input": [{"type": "function_call_output", "output": "5"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
])
def test_a_bad_or_unsupported_field_is_refused_naming_it(body, param):
    with pytest.raises(OpenAIError) as error:
        parse_responses(body)
    assert error.value.param == param and error.value.status == 400


def _stored(response_id, parent, text):
    return StoredResponse(response_id, "s", False, parent, [{"type": "message", "role": "user", "content": text}],
                          [{"type": "message", "role": "assistant", "content": text.upper()}])


def test_a_stored_chain_holds_the_whole_conversation_and_outlives_the_eviction_of_its_start():
    store = ResponseStore(max_responses=2)
    first = _stored("r1", None, "a")
    store.put(first)
    store.put(_stored("r2", first, "b"))
    store.put(_stored("r3", store.get("r2"), "c"))
    assert store.get("r1") is None and store.was_evicted("r1") and not store.was_evicted("r9")
    assert [item["content"] for item in store.get("r3").conversation()] == ["a", "A", "b", "B", "c", "C"]
    assert len(store) == 2 and store.evictions == 1


def test_a_store_of_size_zero_keeps_nothing():
    store = ResponseStore(max_responses=0)
    store.put(_stored("r1", None, "a"))
    assert store.get("r1") is None and len(store) == 0
