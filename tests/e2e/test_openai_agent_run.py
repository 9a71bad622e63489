"""End-to-end: an OpenAI-client agent trains through trajectory capture in a real run.

The generate hook hands the stock ``openai`` client a per-sample base URL on the router's HTTP
front, runs three turns with a local tool whose output is fed back (over Chat Completions for
even samples, over the Responses API with ``previous_response_id`` for odd ones), and returns
``ctx.collect_trajectory(sample)``. The run (CPU engine, Megatron CPU trainer, fully-async with
a weight sync every step) must train on exactly the tokens and logprobs the engine returned to
the client, with only the model's tokens trainable, and its front must answer at --router-port.
"""

import json
import textwrap

import pytest

from slime_async.net import free_port
from examples.models.tiny import build_tiny_model
from train_process import train

AGENT_MODULE = textwrap.dedent('''
    import openai

    TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
    RESPONSES_TOOL = {"type": "function", **TOOL["function"]}

    def local_tool(turn):
        return str(2 + 3 + turn)

    async def agent(ctx, sample, sampling_params):
        client = openai.AsyncOpenAI(base_url=ctx.openai_base_url(sample), api_key="unused", max_retries=0)
        seen = await (responses_turns if sample.index % 2 else chat_turns)(client, sample, sampling_params)
        pieces = await ctx.collect_trajectory(sample)
        pieces[0].metadata["openai_turns"] = seen
        pieces[0].metadata["router_url"] = ctx.router_url
        return pieces

    async def chat_turns(client, sample, sampling_params):
        messages = [{"role": "user", "content": sample.prompt}]
        seen = []
        for turn in range(3):
            answer = await client.chat.completions.create(
                model="policy", messages=messages, tools=[TOOL], max_tokens=8,
                temperature=sampling_params["temperature"])
            choice = answer.choices[0]
            seen.append({"prompt": answer.prompt_token_ids, "ids": choice.token_ids,
                         "logprobs": choice.token_logprobs})
            messages.append(choice.message.model_dump(exclude_none=True))
            for call in choice.message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": local_tool(turn)})
            if not choice.message.tool_calls:  # a random model calls no tool: the agent runs it itself
                messages.append({"role": "user", "content": "the tool says " + local_tool(turn)})
        return seen

    async def responses_turns(client, sample, sampling_params):
        new_items, previous, seen = [{"role": "user", "content": sample.prompt}], None, []
        for turn in range(3):
            answer = await client.responses.create(
                model="policy", input=new_items, previous_response_id=previous, tools=[RESPONSES_TOOL],
                max_output_tokens=8, temperature=sampling_params["temperature"])
            seen.append({"prompt": answer.prompt_token_ids, "ids": answer.token_ids, "logprobs": answer.token_logprobs,
                         "api": "responses"})
            previous = answer.id
            calls = [item for item in answer.output if item.type == "function_call"]
            new_items = [{"type": "function_call_output", "call_id": call.call_id, "output": local_tool(turn)}
                         for call in calls] or [{"role": "user", "content": "the tool says " + local_tool(turn)}]
        return seen

    async def rm(ctx, sample):
        return float(len(sample.response_tokens) % 2)
''')


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-openai-agent")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + 3?", "label": str(a + 3)}) + "\n" for a in range(8)))
    (root / "e2e_agent.py").write_text(AGENT_MODULE)
    port = free_port()
    result = train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--train-mode", "fully-async", "--max-staleness", "1",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "3",
        "--custom-generate-function-path", "e2e_agent:agent", "--custom-rm-path", "e2e_agent:rm",
        "--router-port", str(port), "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4",
    ], import_dirs=(root,))
    return {**result, "port": port}


def test_the_agent_trains_for_every_step_through_the_front(agent_run):
    steps = [m for m in agent_run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0, 3.0]
    assert all("rollout/trajectory_splits" in m and m["router/http_requests"] > 0 for m in steps)
    assert all(s["metadata"]["router_url"] == f"http://127.0.0.1:{agent_run['port']}"
               for s in agent_run["samples"] if "router_url" in s["metadata"])


def test_trained_tokens_and_logprobs_are_exactly_what_the_engine_returned_to_the_client(agent_run):
    samples = agent_run["samples"]
    trajectories = [s for s in samples if "openai_turns" in s["metadata"]]
    assert len(trajectories) >= 6
    apis = {t["metadata"]["openai_turns"][0].get("api", "chat") for t in trajectories}
    assert apis == {"chat", "responses"}  # both APIs trained in the one run
    by_trajectory = {}
    for s in samples:
        by_trajectory.setdefault((s["group_index"], s["index"]), []).append(s)
    whole = 0
    for first in trajectories:
        turns, pieces = first["metadata"]["openai_turns"], by_trajectory[(first["group_index"], first["index"])]
        for turn in turns:
            prompt, ids = turn["prompt"], turn["ids"]
            # The piece that generated this turn: it holds prompt + completion, and the prompt
            # is at least its own (a later piece holds this turn inside its prompt instead).
            piece = next(p for p in pieces if p["tokens"][:len(prompt) + len(ids)] == prompt + ids
                         and len(prompt) >= _prompt_length(p))
            start = len(prompt) - _prompt_length(piece)  # offset in the response
            assert piece["loss_mask"][start:start + len(ids)] == [1] * len(ids)
            assert piece["rollout_logprobs"][start:start + len(ids)] == pytest.approx(turn["logprobs"], abs=1e-6)
        # Nothing else is trainable: template glue and the tool's output are loss_mask 0.
        assert sum(sum(p["loss_mask"]) for p in pieces) == sum(len(t["ids"]) for t in turns)
        whole += len(pieces) == 1
    # A split happens only where the template re-renders a turn differently (here: a random
    # model writes special tokens that the message content drops); most stay one sample.
    assert whole >= len(trajectories) // 2


def _prompt_length(sample):
    return len(sample["tokens"]) - sample["response_length"]
