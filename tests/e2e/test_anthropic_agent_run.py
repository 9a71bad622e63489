"""End-to-end: an Anthropic-client agent trains through trajectory capture in a real run.

The generate hook hands the stock ``anthropic`` client the sample's base URL on the run's HTTP
front (``ctx.anthropic_base_url``), runs two turns with a tool result fed back as a
``tool_result`` block (or a user text when the random model calls nothing), and returns
``ctx.collect_trajectory(sample)``. The run must train on exactly the tokens and logprobs the
engine returned to the client, with only the model's tokens trainable.
"""

import json
import textwrap

import pytest

from examples.models.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model, set_chat_template
from train_process import train

AGENT_MODULE = textwrap.dedent('''
    import anthropic

    TOOL = {"name": "add", "description": "Add.", "input_schema": {"type": "object", "properties": {}}}

    async def agent(ctx, sample, sampling_params):
        seen = []
        async with anthropic.AsyncAnthropic(base_url=ctx.anthropic_base_url(sample), api_key="unused",
                                            max_retries=0) as client:
            messages = [{"role": "user", "content": sample.prompt}]
            for turn in range(2):
                answer = await client.messages.create(
                    model="policy", max_tokens=8, messages=messages, tools=[TOOL], system="Use the tool.",
                    extra_body={"temperature": sampling_params["temperature"]})
                seen.append({"prompt": answer.prompt_token_ids, "ids": answer.token_ids,
                             "logprobs": answer.token_logprobs})
                messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                                  for b in answer.content]})
                calls = [b for b in answer.content if b.type == "tool_use"]
                messages.append({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": "5"} for c in calls]
                    or "the tool says 5"})
        pieces = await ctx.collect_trajectory(sample)
        pieces[0].metadata["anthropic_turns"] = seen
        return pieces

    async def rm(ctx, sample):
        return float(len(sample.response_tokens) % 2)
''')


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e-anthropic-agent")
    model = set_chat_template(build_tiny_model(root / "model", arch="qwen2", seed=0), TOOL_CHAT_TEMPLATE)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + 3?", "label": str(a + 3)}) + "\n" for a in range(4)))
    (root / "e2e_anthropic_agent.py").write_text(AGENT_MODULE)
    return train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--train-mode", "fully-async", "--max-staleness", "1",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--custom-generate-function-path", "e2e_anthropic_agent:agent", "--custom-rm-path", "e2e_anthropic_agent:rm",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4",
    ], import_dirs=(root,))


def test_the_anthropic_agent_trains_on_exactly_the_tokens_the_engine_returned_to_it(agent_run):
    steps = [m for m in agent_run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0]
    samples = agent_run["samples"]
    trajectories = [s for s in samples if "anthropic_turns" in s["metadata"]]
    assert len(trajectories) >= 4
    for first in trajectories:
        pieces = [s for s in samples if (s["group_index"], s["index"]) == (first["group_index"], first["index"])]
        turns = first["metadata"]["anthropic_turns"]
        for turn in turns:
            prompt, ids = turn["prompt"], turn["ids"]
            piece = next(p for p in pieces if p["tokens"][:len(prompt) + len(ids)] == prompt + ids
                         and len(prompt) >= len(p["tokens"]) - p["response_length"])
            start = len(prompt) - (len(piece["tokens"]) - piece["response_length"])
            assert piece["loss_mask"][start:start + len(ids)] == [1] * len(ids)
            assert piece["rollout_logprobs"][start:start + len(ids)] == pytest.approx(turn["logprobs"], abs=1e-6)
        assert sum(sum(p["loss_mask"]) for p in pieces) == sum(len(t["ids"]) for t in turns)
