"""Anthropic Messages requests as the chat the template renders, and the answer's stop reason."""

import pytest

from actors.router.anthropic_protocol import content_blocks, is_messages_path, parse_messages, stop_of
from actors.router.completion import Completion
from actors.router.openai_protocol import OpenAIError
from actors.router.tool_calls import ToolCall

ADD = {"name": "add", "description": "Add.", "input_schema": {"type": "object", "properties": {}}}


def _body(**fields):
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_system_blocks_tool_use_and_tool_results_become_template_messages():
    parsed = parse_messages(_body(system=[{"type": "text", "text": "Be"}, {"type": "text", "text": "brief."}],
                                  tools=[ADD], messages=[
        {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Adding."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2}}]},
        {"role": "user", "content": [{"type": "text", "text": "note"},
                                     {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                      "content": [{"type": "text", "text": "5"}, {"type": "text", "text": "!"}]},
                                     {"type": "text", "text": "go on"}]}]))
    assert parsed.messages == [
        {"role": "system", "content": "Be\nbrief."},
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}}]},
        {"role": "user", "content": "note"},  # text before a result stays before it
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5\n!"},
        {"role": "user", "content": "go on"},
    ]
    assert parsed.tools == [{"type": "function", "function": {
        "name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}}]
    assert parsed.tool_choice == "auto"


@pytest.mark.parametrize("choice, expected", [
    ({"type": "any"}, "required"),
    ({"type": "tool", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ({"type": "none"}, "none"),
])
def test_tool_choice_maps_to_the_chat_paths_vocabulary(choice, expected):
    parsed = parse_messages(_body(tools=[ADD], tool_choice=choice))
    assert parsed.tool_choice == expected
    assert (parsed.tools is None) == (expected == "none")  # none: the tools are not rendered


def test_sampling_fields_take_sglangs_names():
    parsed = parse_messages(_body(temperature=0, top_p=0.5, top_k=0, stop_sequences=["</a>", ""], stream=True,
                                  metadata={"user_id": "u"}))
    assert parsed.sampling.params == {"temperature": 0.0, "top_p": 0.5, "top_k": -1}
    assert parsed.sampling.stop == ("</a>",) and parsed.sampling.stream and parsed.sampling.max_tokens == 8


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),  # no tools
    ({"tools": [{"name": "x"}]}, "tools"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0"),
    ({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}]}]}, "messages.0"),
])
def test_a_bad_field_is_one_400_naming_it(fields, param):
    with pytest.raises(OpenAIError) as error:
        parse_messages(_body(**fields))
    assert error.value.status == 400 and error.value.param == param and str(error.value).startswith(param)


def test_stop_reason_follows_the_finish_and_the_calls():
    stopped = Completion(finish_reason={"type": "stop", "matched": "</a>"})
    assert stop_of(stopped, [], ("</a>",)) == ("stop_sequence", "</a>")
    assert stop_of(Completion(finish_reason={"type": "stop", "matched": 151645}), [], ()) == ("end_turn", None)
    assert stop_of(Completion(finish_reason={"type": "length"}), [], ()) == ("max_tokens", None)
    assert stop_of(stopped, [ToolCall("add", {})], ("</a>",)) == ("tool_use", None)


def test_an_answer_has_a_text_block_unless_it_is_only_calls():
    assert content_blocks("", []) == [{"type": "text", "text": ""}]
    [call] = content_blocks("", [ToolCall("add", {"a": 1})])
    assert call["type"] == "tool_use" and call["id"].startswith("toolu_") and call["input"] == {"a": 1}


def test_messages_paths_with_and_without_a_session():
    assert is_messages_path("/v1/messages") and is_messages_path("/sessions/s-1/v1/messages/count_tokens")
    assert not is_messages_path("/v1/chat/completions")
