"""The verifiers examples' environments (a SingleTurnEnv and a ToolEnv, ``verifiers==0.3.1``) run
unchanged in two-step CPU training runs: real CPU engine, real router front, real Megatron trainer,
fully-async GRPO with ``actors.rollout.verifiers_env``'s hooks.

A random tiny model answers nothing right, so each fixture first teaches it the example's ideal
episodes on the training rows (plain torch). Each run's samples must then carry the env's own
rubric rewards (its reward function's name is the logged metric, and every sample's reward is the
exact match the rubric computes from the trained text) and token-exact trajectories (the tool's
output loss mask 0, the model's tokens with the engine's logprobs as the initial model recomputes
them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra is not installed")

from transformers import AutoTokenizer  # noqa: E402

from examples.models.tiny import build_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e")]

from test_agentic_smoke import (  # noqa: E402
    assert_observations_are_untrained, assert_trained_tokens_are_the_engines, calls_in, front_observation, memorize,
    read_jsonl)
from train_process import train  # noqa: E402
from examples.verifiers import sft_data  # noqa: E402
from examples.verifiers.calculator.env import calculator  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a busy 2-core machine is slow
END = "<|im_end|>"


def verifiers_run(root: Path, name: str, env_args: str, extra: list[str]) -> dict:
    """The example's env (small datasets), a tiny model that memorized its episodes, two GRPO steps."""
    settings = root / "env.yaml"
    settings.write_text(f"env_id: examples.verifiers.{name}.env\nenv_args: {env_args}\nmax_tokens: 48\n")
    data = root / "data"
    assert sft_data.main(["--config", str(settings), "--out", str(data)]) == 0
    model = build_tiny_model(root / "model", arch="qwen2", seed=0, chat_template="tools",
                             corpus=(data / "corpus.txt").read_text().splitlines())
    memorize(model, read_jsonl(data / "sft.jsonl"), lr=3e-3)
    run = train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data / "train.jsonl"),
        "--eval-prompt-data", str(data / "heldout.jsonl"), "--eval-interval", "2", "--apply-chat-template",
        "--train-mode", "fully-async", "--max-staleness", "1", "--use-tis",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--rollout-temperature", "1.0",
        "--custom-generate-function-path", "actors.rollout.verifiers_env:generate",
        "--custom-rm-path", "actors.rollout.verifiers_env:reward", "--group-rm",
        "--custom-config-path", str(settings),
        "--engine-type", "cpu", "--micro-batch-size", "8", "--lr", "1e-5", *extra,
    ], import_dirs=(ROOT,))
    return {**run, "model": model, "rows": {r["metadata"]["verifiers"]["input"]["question"]: r["label"]
                                             for r in read_jsonl(data / "train.jsonl")}}


@pytest.fixture(scope="module")
def single_turn_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifiers-single-turn")
    return verifiers_run(root, "reverse_digits", "{num_train: 8, num_eval: 2}", ["--rollout-max-response-len", "8"])


@pytest.fixture(scope="module")
def tool_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifiers-tool")
    return verifiers_run(root, "calculator", "{num_train: 8, num_eval: 2, max_turns: 3}",
                         ["--rollout-max-response-len", "48"])


def answers(run: dict, sample: dict, tokenizer) -> str:
    """The sample's last model turn as text (what the env's parser reads from its completion)."""
    response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
    text = tokenizer.decode(response, skip_special_tokens=False)
    return text.split(f"{END}\n<|im_start|>assistant\n")[-1].removesuffix(END)


def assert_the_rubric_scored(run: dict, tokenizer) -> None:
    steps = [m for m in run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0]
    # The rubric's reward function and verifiers' own monitors are the logged metrics.
    assert any("rollout/exact_answer" in m for m in steps)
    assert any("eval/exact_answer" in m and "eval/num_turns" in m for m in run["metrics"])
    for sample in run["samples"]:
        question = sample["metadata"]["verifiers"]["input"]["question"]
        label = run["rows"][question]
        assert sample["reward"] == float(answers(run, sample, tokenizer).strip() == label)
        assert sample["metadata"]["metrics"]["exact_answer"] == sample["reward"]
    assert any(s["reward"] == 1.0 for s in run["samples"])


def test_a_single_turn_env_trains_on_its_rubrics_rewards_and_the_engines_tokens(single_turn_run):
    tokenizer = AutoTokenizer.from_pretrained(single_turn_run["model"])
    assert_the_rubric_scored(single_turn_run, tokenizer)
    assert all(s["metadata"]["metrics"]["num_turns"] == 1 for s in single_turn_run["samples"])
    assert_trained_tokens_are_the_engines(single_turn_run, tokenizer, lambda s, turns: [])


def test_a_tool_env_runs_its_tool_and_trains_the_model_turns_only(tool_run):
    tokenizer = AutoTokenizer.from_pretrained(tool_run["model"])
    assert_the_rubric_scored(tool_run, tokenizer)
    called = [s for s in tool_run["samples"] if s["metadata"]["metrics"].get("calculator_calls")]
    assert called, "no sample called the env's tool"
    assert all(s["metadata"]["metrics"]["num_turns"] >= 2 for s in called)
    assert_trained_tokens_are_the_engines(tool_run, tokenizer, tool_observations)
    # The check fails when a tool's output is trained: the turns around it merge into one span.
    whole = [s for s in called if s["metadata"]["trajectory_parts"] == 1]
    assert whole, "every called rollout was split into pieces"
    trained = {**whole[0], "loss_mask": [1] * len(whole[0]["loss_mask"])}
    with pytest.raises(AssertionError, match="1 model spans"):
        assert_observations_are_untrained({**tool_run, "samples": [trained]}, tokenizer, tool_observations)


def tool_observations(sample: dict, turns: list[str]) -> list[str]:
    """Every model turn but a piece's last called the tool (ToolEnv stops at a turn without a call),
    and the front rendered the tool's answer to the call the model wrote (at temperature 1 not
    always the row's expression) in the template's glue."""
    return [front_observation(turn, [tool_answer(call) for call in calls_in(turn)]) for turn in turns[:-1]]


def tool_answer(call) -> str:
    """What the env's ToolEnv sends back for a call: the tool's result, or the error as its default
    error formatter writes it (an unknown tool, bad arguments)."""
    try:
        return str({"calculator": calculator}[call.name](**call.arguments))
    except Exception as error:  # noqa: BLE001 - ToolEnv answers any failure of the call this way
        return str(error)
