"""CPU smoke runs of the code_interpreter and openai_agent examples: real sandbox, real CPU engine,
real Megatron trainer, fully-async GRPO for two steps with each example's own hook and reward.

A random tiny model writes no code, so each fixture first teaches it the examples' traces on the
training prompts (a few hundred plain-torch steps on eight episodes). Each run must then call its
tool, keep the tool's output out of the loss, and train exactly the tokens the engine sampled:
their logprobs, recomputed by the initial model on the trained token sequences, equal the ones
the engine returned.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from actors.router.tool_calls import ToolCall, parse_tool_calls
from examples.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e")]

from train_process import train  # noqa: E402
from examples.agentic.code_interpreter import make_task as code_make_task  # noqa: E402
from examples.agentic.openai_agent import make_task as openai_make_task  # noqa: E402

pytestmark = pytest.mark.slow
END = "<|im_end|>"


def memorize(model_dir: Path, sft_rows: list[dict], steps: int = 300, lr: float = 1e-2) -> None:
    """Overfit the model on the rows' traces (tokenized per segment, as the rollout builds them)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    sequences, targets = [], []
    for row in sft_rows:
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        target = [-100] * len(ids)  # the prompt and the tool's output are not the model's to write
        for segment in row["label"]:
            piece = tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
            ids, target = ids + piece, target + (piece if segment["train"] else [-100] * len(piece))
        sequences.append(ids + [tokenizer.eos_token_id])
        targets.append(target + [tokenizer.eos_token_id])
    width = max(map(len, sequences))
    ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in sequences])
    labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small only loses time to thread hand-offs on a busy machine
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 0.05, f"the traces were not learned (loss {loss.item():.3f})"
    model.save_pretrained(model_dir, safe_serialization=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_example(root: Path, name: str, data: Path, model: Path) -> dict:
    example = ROOT / "examples" / "agentic" / name
    return train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
        "--eval-prompt-data", str(data / "train.jsonl"), "--eval-interval", "2",
        "--train-mode", "fully-async", "--max-staleness", "1", "--use-tis",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--rollout-max-response-len", "64", "--rollout-temperature", "1.0",
        "--custom-generate-function-path", f"examples.agentic.{name}.agent:generate",
        "--custom-rm-path", f"examples.agentic.{name}.agent:reward",
        "--custom-config-path", str(example / "agent.yaml"),
        "--engine-type", "cpu", "--micro-batch-size", "8", "--lr", "1e-5",
    ], import_dirs=(ROOT,))


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("code-interpreter-smoke")
    data = root / "data"
    code_make_task.main(["--out", str(data), "--train", "8", "--heldout", "2"])
    model = build_tiny_model(root / "model", arch="qwen2", seed=0, corpus=(data / "corpus.txt").read_text().splitlines())
    memorize(model, read_jsonl(data / "sft.jsonl"))
    return {**run_example(root, "code_interpreter", data, model), "model": model}


@pytest.fixture(scope="module")
def openai_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai-agent-smoke")
    data = root / "data"
    openai_make_task.main(["--out", str(data), "--train", "8", "--heldout", "2"])
    model = build_tiny_model(root / "model", arch="qwen2", seed=0, chat_template="tools",
                             corpus=(data / "corpus.txt").read_text().splitlines())
    memorize(model, read_jsonl(data / "sft.jsonl"), lr=3e-3)  # longer episodes: 1e-2 does not settle in 300 steps
    return {**run_example(root, "openai_agent", data, model), "model": model}


def assert_calls_ran_and_were_logged(run: dict) -> None:
    steps = [m for m in run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0]
    # A step logs the rollout's window since the step before, which may hold no finished group.
    rollouts = [m for m in steps if "rollout/reward_mean" in m]
    assert rollouts and all(m["rollout/tool_calls"] > 0 and m["rollout/turns"] >= 1 for m in rollouts)
    evals = [m for m in run["metrics"] if "eval/reward_mean" in m]
    assert evals and all(m["eval/tool_calls"] >= 1 and m["eval/turns"] >= 2 for m in evals)
    called = [s for s in run["samples"] if s["metadata"].get("tool_calls")]
    assert called, "no sample called its tool"
    for sample in called:
        for call in sample["metadata"]["tool_calls"]:
            assert call["exit_code"] == 0 and call["killed_reason"] is None  # ran in the real sandbox
    assert any(s["reward"] == 1.0 for s in run["samples"])


def assert_trained_tokens_are_the_engines(run: dict, tokenizer, observations) -> None:
    """Observations have loss mask 0; the model's tokens carry the engine's logprobs."""
    assert_observations_are_untrained(run, tokenizer, observations)
    assert_model_tokens_are_the_engines(run)


def assert_observations_are_untrained(run: dict, tokenizer, observations) -> None:
    """Each response's loss-mask-0 spans are exactly the observations its episode fed back.

    ``observations(sample, turns)`` gives the texts the sample's mask-0 spans must decode to, in
    order, from its model turns (its mask-1 spans, decoded). The spans are found by the loss mask,
    not by searching for a re-tokenized expected text: a tool's output is what the tool returned
    for the call the model wrote (at temperature 1 not always the row's answer). A trained
    observation merges the turns around it into one span, so the spans of an episode (all its
    pieces) must also number the turns its hook logged (``metadata.metrics.turns``).
    """
    spans_of: Counter[tuple[int, int]] = Counter()  # an episode's model spans, over its pieces
    logged: dict[tuple[int, int], float] = {}  # the turns its hook counted (on one piece)
    for sample in run["samples"]:
        response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
        episode = (sample["group_index"], sample["index"])
        mask = sample["loss_mask"]
        assert not mask or mask[0] == 1, f"episode {episode}: the response starts untrained"
        turns, shown = spans(response, mask, tokenizer)
        spans_of[episode] += len(turns)
        if "turns" in sample["metadata"].get("metrics", {}):
            logged[episode] = sample["metadata"]["metrics"]["turns"]
        expected = observations(sample, turns)
        assert shown == expected, (
            f"episode {episode}: loss-mask-0 spans {shown!r}, expected the observations {expected!r} "
            f"(model turns {turns!r})")
    for episode, count in spans_of.items():
        assert count == logged.get(episode), (
            f"episode {episode}: {count} model spans (loss mask 1) for {logged.get(episode)} turns: an "
            "observation between turns was trained")


def assert_model_tokens_are_the_engines(run: dict) -> None:
    """The initial model, run on each trained sequence, gives the engine's logprob for each trained
    token (so the trained tokens and their context are the ones the engine saw); untrained tokens
    carry logprob 0."""
    model = AutoModelForCausalLM.from_pretrained(run["model"]).eval()
    checked = 0
    for sample in run["samples"]:
        if set(sample["token_versions"]) != {0}:
            continue  # generated by an updated policy: the initial model cannot reproduce it
        response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
        with torch.no_grad():
            logits = model(torch.tensor([sample["tokens"]])).logits[0].float()
        prompt = len(sample["tokens"]) - sample["response_length"]
        logprobs = torch.log_softmax(logits[prompt - 1:-1], dim=-1)
        recomputed = logprobs.gather(1, torch.tensor(response)[:, None])[:, 0].tolist()
        for k, trained in enumerate(sample["loss_mask"]):
            if trained:
                assert recomputed[k] == pytest.approx(sample["rollout_logprobs"][k], abs=2e-3)
            else:
                assert sample["rollout_logprobs"][k] == 0.0
        checked += 1
    assert checked >= 1


def spans(response: list[int], mask: list[int], tokenizer) -> tuple[list[str], list[str]]:
    """The response's maximal runs of model tokens (loss mask 1) and of the rest (0), each decoded."""
    runs: dict[int, list[str]] = {0: [], 1: []}
    start = 0
    for end in range(1, len(response) + 1):
        if end == len(response) or mask[end] != mask[start]:
            runs[mask[start]].append(tokenizer.decode(response[start:end], skip_special_tokens=False,
                                                      clean_up_tokenization_spaces=False))
            start = end
    return runs[1], runs[0]


def front_observation(turn: str, outputs: list[str]) -> str:
    """What the router front puts after a model turn that called tools, with the tools template: each
    tool message in its glue, then the next assistant turn's opening (and the turn's <|im_end|> if
    the turn was cut at its token limit before writing it)."""
    closing = "" if turn.endswith(END) else END
    return (closing + "\n" + "".join(f"<|im_start|>user\n<tool_response>\n{output}\n</tool_response>{END}\n"
                                     for output in outputs) + "<|im_start|>assistant\n")


def calls_in(turn: str) -> list[ToolCall]:
    """The calls the front parsed out of a model turn (hermes, the tools template's format)."""
    return parse_tool_calls(turn, "hermes")[1]


def test_the_code_interpreter_runs_the_models_code_and_trains_on_its_calls_only(code_run):
    assert_calls_ran_and_were_logged(code_run)
    tokenizer = AutoTokenizer.from_pretrained(code_run["model"])
    # The hook appends each call's shown output (task.observation) as it tokenized it.
    assert_trained_tokens_are_the_engines(
        code_run, tokenizer, lambda s, _turns: [call["output"] for call in s["metadata"].get("tool_calls", [])])


def test_the_openai_agent_trains_through_trajectory_capture_with_the_tool_output_masked(openai_run):
    assert_calls_ran_and_were_logged(openai_run)
    tokenizer = AutoTokenizer.from_pretrained(openai_run["model"])
    # The front renders each tool result in the template's glue after the turn that called it; every
    # turn but a piece's last called (the agent stops at a turn without a call or out of budget).
    ran: dict[tuple[int, int], dict[str | None, str]] = {}  # the episode's code -> output (on its last piece)
    for sample in openai_run["samples"]:
        for call in sample["metadata"].get("tool_calls", []):
            ran.setdefault((sample["group_index"], sample["index"]), {})[call["code"]] = call["output"]

    def observations(sample: dict, turns: list[str]) -> list[str]:
        outputs = ran.get((sample["group_index"], sample["index"]), {})
        return [front_observation(turn, [outputs.get(code_of(call), f"<no run of {code_of(call)!r}>")
                                         for call in calls_in(turn)]) for turn in turns[:-1]]

    assert_trained_tokens_are_the_engines(openai_run, tokenizer, observations)


def code_of(call: ToolCall) -> str | None:
    """The code of a run_python call as the agent reads it (None: it ran no code)."""
    code = call.arguments.get("code") if call.name == "run_python" else None
    return code if isinstance(code, str) else None
