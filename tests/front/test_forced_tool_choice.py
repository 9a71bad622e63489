"""``tool_choice`` required / a named function (Anthropic ``any`` / ``tool``) constrains generation:
the front forces the call's opening (``<tool_call>\\n``, for a named function up to its
``"arguments": ``) as prompt tokens, so the answer is a call of the right function even from a
model that would have answered in text; the forced tokens are in the trajectory with loss mask 0.

The model: the tiny random Qwen2 with a compact hermes-style template (short prompts keep its
training cheap), taught by a few dozen Adam steps (``tool_model_dir``) to answer the question in
text, and — only when a call has been opened — to finish it with ``{"a": 2, "b": 3}``, choosing
``add`` when it names the function itself. Never is it taught to open a call.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.router.text_model import TextModel
from examples.models.tiny import build_tiny_model, set_chat_template
from slime_async.sample import Sample
from slime_async.trajectory import to_samples
from tests.front.conftest import ADD_TOOL

SUB_TOOL = {"type": "function", "function": {**ADD_TOOL["function"], "name": "sub", "description": "Subtract."}}
# The tool names on one line, calls as hermes <tool_call> blocks (what the front's parser reads).
COMPACT_TOOL_TEMPLATE = (
    "{%- if tools %}{{- 'tools:' }}{%- for tool in tools %}{{- ' ' + tool['function']['name'] }}{%- endfor %}"
    "{{- '\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' "
    "+ (call['function']['arguments'] | tojson) + '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]
FOLLOW_UP = QUESTION + [{"role": "assistant", "content": "Five."}, {"role": "user", "content": "Use a tool."}]
STEPS = 120
ARGS = '{"a": 2, "b": 3}}\n</tool_call><|im_end|>'


def _lessons(model: TextModel) -> list[tuple[str, str]]:
    """(context, what to write next): text after the generation prompt, a call only once opened."""
    lessons = []
    for messages, tools in ((QUESTION, [ADD_TOOL]), (QUESTION, [ADD_TOOL, SUB_TOOL]), (FOLLOW_UP, [ADD_TOOL, SUB_TOOL])):
        prompt = model.render_chat(messages, tools)
        lessons += [(prompt, "Five.<|im_end|>"), (prompt + "<tool_call>\n", '{"name": "add", "arguments": ' + ARGS)]
        lessons += [(prompt + f'<tool_call>\n{{"name": "{t["function"]["name"]}", "arguments": ', ARGS) for t in tools]
    return lessons


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return teach_tool_model(tmp_path_factory.mktemp("front-tool-model"))


def teach_tool_model(out_dir: Path) -> Path:
    directory = build_tiny_model(out_dir, arch="qwen2", seed=3)
    set_chat_template(directory, COMPACT_TOOL_TEMPLATE)
    text = TextModel.load(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    rows = [(text.encode(context), text.encode(target)) for context, target in _lessons(text)]
    width = max(len(c) + len(t) for c, t in rows)  # one right-padded batch of every lesson
    ids = torch.tensor([c + t + [0] * (width - len(c) - len(t)) for c, t in rows])
    mask = torch.tensor([[1] * (len(c) + len(t)) + [0] * (width - len(c) - len(t)) for c, t in rows])
    # only what follows the context is taught
    labels = torch.tensor([[-100] * len(c) + t + [-100] * (width - len(c) - len(t)) for c, t in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64-wide model: more threads only contend on a busy machine (10x slower)
    torch.manual_seed(0)
    try:
        for _ in range(STEPS):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tool_engine(tool_model_dir: Path) -> Iterator[str]:
    log_path = Path(tempfile.mkdtemp(prefix="front-tool-engine-")) / "engine.log"
    process, url = start_local_engine(tool_model_dir, log_path, timeout=180)
    try:
        yield url
    finally:
        stop_local_engine(process)


@pytest.fixture(scope="module")
def tool_text_model(tool_model_dir: Path) -> TextModel:
    return TextModel.load(tool_model_dir)


@pytest.fixture(scope="module")
def ask(tool_text_model: TextModel) -> dict:
    """Greedy, ending at the turn's end (the tiny model's EOS is another token)."""
    im_end = tool_text_model.tokenizer.convert_tokens_to_ids("<|im_end|>")
    return {"model": "tiny", "max_tokens": 64, "temperature": 0, "extra_body": {"stop_token_ids": [im_end]}}


async def _front(start_front, tool_engine, tool_text_model) -> tuple[object, str]:
    return await start_front([tool_engine], tool_text_model)


async def test_required_and_named_tool_choice_force_a_call_the_model_would_not_make(
        tool_engine, tool_text_model, start_front, ask):
    _, url = await _front(start_front, tool_engine, tool_text_model)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    both = [ADD_TOOL, SUB_TOOL]
    free = await client.chat.completions.create(messages=QUESTION, tools=both, **ask)
    assert free.choices[0].message.tool_calls is None and free.choices[0].message.content.startswith("Five.")
    cases = [("required", [ADD_TOOL], "add"), ("required", both, "add"),
             ({"type": "function", "function": {"name": "sub"}}, both, "sub")]
    for tool_choice, tools, name in cases:
        for stream in (False, True):
            answer = await client.chat.completions.create(messages=QUESTION, tools=tools, tool_choice=tool_choice,
                                                          stream=stream, **ask)
            calls = ([call for chunk in [c async for c in answer] for call in chunk.choices[0].delta.tool_calls or []]
                     if stream else answer.choices[0].message.tool_calls)
            assert [(c.function.name, json.loads(c.function.arguments)) for c in calls or []] == [
                (name, {"a": 2, "b": 3})], (tool_choice, stream)


async def test_responses_and_messages_force_the_named_or_any_tool(tool_engine, tool_text_model, start_front, ask):
    _, url = await _front(start_front, tool_engine, tool_text_model)
    responses = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    flat = [{"type": "function", **tool["function"]} for tool in (ADD_TOOL, SUB_TOOL)]
    response = await responses.responses.create(model="tiny", input=QUESTION, tools=flat, max_output_tokens=64,
                                                temperature=0, tool_choice={"type": "function", "name": "sub"},
                                                extra_body=ask["extra_body"])
    assert [(item.type, item.name, json.loads(item.arguments)) for item in response.output] == [
        ("function_call", "sub", {"a": 2, "b": 3})]
    messages = anthropic.AsyncAnthropic(base_url=url, api_key="unused", max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in (ADD_TOOL, SUB_TOOL)]
    for tool_choice, name in (({"type": "tool", "name": "sub"}, "sub"), ({"type": "any"}, "add")):
        message = await messages.messages.create(model="tiny", max_tokens=64, messages=QUESTION, tools=tools,
                                                 tool_choice=tool_choice,
                                                 extra_body={"temperature": 0} | ask["extra_body"])
        assert [(block.type, block.name, block.input) for block in message.content] == [
            ("tool_use", name, {"a": 2, "b": 3})] and message.stop_reason == "tool_use"


async def test_forced_tokens_are_in_the_trajectory_with_loss_mask_0(tool_engine, tool_text_model, start_front, ask):
    router, url = await _front(start_front, tool_engine, tool_text_model)
    client = openai.AsyncOpenAI(base_url=url + "/sessions/forced/v1", api_key="unused", max_retries=0)
    tools = [ADD_TOOL, SUB_TOOL]
    first = await client.chat.completions.create(messages=QUESTION, tools=tools, **ask)
    assert first.choices[0].message.content == "Five."
    second = await client.chat.completions.create(messages=FOLLOW_UP, tools=tools, **ask,
                                                  tool_choice={"type": "function", "function": {"name": "sub"}})
    [call] = second.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("sub", {"a": 2, "b": 3})
    prompt1, out1 = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    prompt2, out2 = second.model_extra["prompt_token_ids"], second.choices[0].model_extra["token_ids"]
    glue = prompt2[len(prompt1) + len(out1):]  # the next user turn, the generation prompt, the forced opening
    assert prompt2[:len(prompt1) + len(out1)] == prompt1 + out1
    assert tool_text_model.decode(glue, skip_special_tokens=False).endswith('<tool_call>\n{"name": "sub", "arguments": ')
    [piece] = to_samples(await router.ask("take_trajectory", "forced"), Sample(group_index=0, index=0, prompt="p"))
    assert piece.tokens == prompt2 + out2
    assert piece.loss_mask == [1] * len(out1) + [0] * len(glue) + [1] * len(out2)  # forced: never trained
    assert tool_text_model.decode(out2, skip_special_tokens=False) == ARGS
