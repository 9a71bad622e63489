"""Contract tests of the HTTP front's pure parts, against hand-written expected values:
tool-call parsing, OpenAI and SGLang request parsing, stop-string trimming, stream deltas."""

import pytest

from actors.router.completion import Completion, TextStream, completion_text
from actors.router.native_protocol import NativeError, parse_generate
from actors.router.openai_protocol import OpenAIError, parse_chat, parse_completions
from actors.router.tool_calls import MessageError, ToolCall, choose_parser, parse_tool_calls, template_messages

# ----- tool calls ---------------------------------------------------------------------------------


def test_hermes_call_after_content_is_split_into_content_and_call():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    assert parse_tool_calls(text, "hermes") == ("Let me add.", [ToolCall("add", {"a": 1, "b": 2})])


def test_hermes_parses_several_calls_and_arguments_written_as_a_string():
    text = ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": "{\\"x\\": [1]}"}\n</tool_call>')
    assert parse_tool_calls(text, "hermes") == (None, [ToolCall("a", {}), ToolCall("b", {"x": [1]})])


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "add", "arguments": {"a": 1',  # cut off by the length limit
    '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>',  # invalid JSON
    '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
    "no call at all",
])
def test_hermes_text_that_is_not_a_whole_valid_call_stays_content(text):
    assert parse_tool_calls(text, "hermes") == (text, [])


def test_llama3_json_call_with_parameters_and_python_tag():
    text = '<|python_tag|>{"name": "search", "parameters": {"q": "rl"}}'
    assert parse_tool_calls(text, "llama3_json") == (None, [ToolCall("search", {"q": "rl"})])


def test_llama3_json_several_calls_separated_by_semicolons():
    text = '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}'
    assert parse_tool_calls(text, "llama3_json") == (None, [ToolCall("a", {"x": 1}), ToolCall("b", {})])


@pytest.mark.parametrize("text", ["The answer is 3.", '{"name": "a", "parameters": {}} and then prose',
                                  '{"not": "a call"}'])
def test_llama3_json_prose_or_foreign_json_stays_content(text):
    assert parse_tool_calls(text, "llama3_json") == (text, [])


def test_parser_is_chosen_by_the_template_then_the_model_type():
    assert choose_parser("...<tool_call>...", "llama") == "hermes"
    assert choose_parser("{{ '<|python_tag|>' }}", None) == "llama3_json"
    assert choose_parser("plain", "llama") == "llama3_json"
    assert choose_parser("plain", "qwen2") == "hermes"


def test_a_tool_call_is_answered_with_its_arguments_as_a_json_string():
    call = ToolCall("add", {"a": 1}, id="call_1").to_openai(index=0)
    assert call == {"id": "call_1", "type": "function", "index": 0,
                    "function": {"name": "add", "arguments": '{"a": 1}'}}


def test_template_messages_decode_tool_arguments_and_join_text_parts():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "1 + "}, {"type": "text", "text": "2?"}]},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
    ]
    out = template_messages(messages)
    assert out[0]["content"] == "1 + 2?"
    assert out[1]["content"] == "" and out[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_template_messages_name_the_message_that_is_wrong():
    with pytest.raises(MessageError) as error:
        template_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    assert error.value.param == "messages[0].content"
    with pytest.raises(MessageError) as error:
        template_messages([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}])
    assert "messages[0].tool_calls[0]" in str(error.value)


# ----- OpenAI requests ------------------------------------------------------------------------------


def test_chat_request_maps_openai_fields_to_sglang_sampling():
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "top_p": 0.5,
                       "max_completion_tokens": 7, "stop": "END", "n": 2, "seed": 3, "top_k": 5, "logprobs": True,
                       "tools": [{"type": "function", "function": {"name": "f"}}]})
    s = chat.sampling
    assert (s.n, s.max_tokens, s.stop, s.logprobs) == (2, 7, ("END",), True)
    assert s.params == {"temperature": 0.0, "top_p": 0.5, "sampling_seed": 3, "top_k": 5}
    assert chat.parse_tools and chat.tools


def test_tool_choice_none_renders_and_parses_no_tools():
    chat = parse_chat({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none",
                       "tools": [{"type": "function", "function": {"name": "f"}}]})
    assert chat.tools is None and not chat.parse_tools


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),  # without logprobs
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": 3}, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
])
def test_chat_request_errors_name_the_parameter(body, param):
    with pytest.raises(OpenAIError) as error:
        parse_chat(body)
    assert error.value.param == param and error.value.status == 400


def test_completions_defaults_to_16_tokens_and_takes_up_to_5_top_logprobs():
    assert parse_completions({"prompt": "a"}).sampling.max_tokens == 16
    assert parse_completions({"prompt": [[1, 2], "b"], "logprobs": 0}).prompts == [[1, 2], "b"]
    assert parse_completions({"prompt": "a", "logprobs": 5}).sampling.top_logprobs == 5
    with pytest.raises(OpenAIError) as error:
        parse_completions({"prompt": "a", "logprobs": 6})
    assert error.value.param == "logprobs"


# ----- SGLang /generate requests --------------------------------------------------------------------


def test_generate_takes_text_batches_n_and_keeps_text_stops_at_the_front():
    encode = lambda text: [ord(c) for c in text]  # noqa: E731
    items, is_batch, stream = parse_generate(
        {"text": ["ab", "c"], "sampling_params": {"max_new_tokens": 5, "stop": ["</s>"], "no_stop_trim": True, "n": 2,
                                                 "temperature": 0.5, "stop_token_ids": [9]}, "rid": ["x", "y"]},
        encode)
    assert is_batch and not stream
    assert [item.rid for item in items] == ["x-0", "x-1", "y-0", "y-1"]
    spec = items[0].spec
    assert spec.prompt_ids == [97, 98] and spec.max_new_tokens == 5 and spec.stop == ("</s>",) and spec.no_stop_trim
    assert spec.sampling_params == {"temperature": 0.5, "stop_token_ids": [9]}  # what the engines get


@pytest.mark.parametrize("body,words", [
    ({}, "one of text or input_ids"),
    ({"input_ids": [1], "sampling_params": {"stop_regex": "a+"}}, "stop_regex"),
    ({"input_ids": [1], "sampling_params": {"temprature": 1.0}}, "did you mean 'temperature'"),
    ({"input_ids": [1], "top_logprobs_num": -1}, "top_logprobs_num must be an integer in"),
    ({"input_ids": [1], "bogus": 1}, "unknown /generate field(s): bogus"),
    ({"input_ids": [[1], [2]], "stream": True}, "stream=true needs a single prompt"),
])
def test_generate_errors_say_what_is_wrong(body, words):
    with pytest.raises(NativeError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse_generate(body, lambda text: [1])


# ----- stop strings and stream deltas -----------------------------------------------------------------

# A toy vocabulary: each id decodes to a fixed string, so expected cut points can be worked out by hand.
VOCAB = {1: "The", 2: " ans", 3: "wer", 4: " </", 5: "sea", 6: "rch>", 7: " x", 8: "rch>tail"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def test_text_is_trimmed_at_the_stop_string_unless_no_stop_trim():
    completion = Completion(output_ids=[1, 4, 5, 8], finish_reason={"type": "stop", "matched": "</search>"})
    assert completion_text(completion, decode, no_stop_trim=False) == "The "
    assert completion_text(completion, decode, no_stop_trim=True) == "The </search>tail"
    by_token = Completion(output_ids=[1, 2], finish_reason={"type": "stop", "matched": 2})
    assert completion_text(by_token, decode, no_stop_trim=False) == "The"  # the stop token is trimmed too
    assert completion_text(by_token, decode, no_stop_trim=True) == "The ans"


def test_stream_holds_back_a_possible_stop_start_and_a_partial_character():
    stream = TextStream(["</search>"])
    assert stream.delta("Hello </se", final=False) == "Hello "
    assert stream.delta("Hello </sea\ufffd", final=False) == ""
    assert stream.delta("Hello </x ok", final=False) == "</x ok"
    assert stream.delta("Hello </x ok!", final=True) == "!"
