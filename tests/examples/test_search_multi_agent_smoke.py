"""CPU smoke runs of the search and multi_agent examples: real CPU engine, real Megatron trainer,
fully-async GRPO for two steps with each example's own hook, reward and settings.

A random tiny model writes no search call, so each fixture first fits it to eight of the
example's warm-start traces (plain torch). The run must then search (retrieved passages appended
with loss mask 0), log searches and turns per sample, and compute the reward; the multi-agent run
must hold its three turns in one sample with the role prompts untrained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from examples.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "e2e")]

from train_process import train  # noqa: E402
from examples.agentic.multi_agent import prepare as multi_prepare, task as multi_task  # noqa: E402
from examples.agentic.search import prepare as search_prepare  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # two runs each; a busy machine is slow


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def fit(model_dir: Path, sft_rows: list[dict], steps: int = 150) -> None:
    """Overfit the model on the rows' traces, tokenized per segment as the hooks build them."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    sequences = []
    for row in sft_rows:
        ids = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        for segment in row["label"]:
            ids += tokenizer(segment["text"], add_special_tokens=False)["input_ids"]
        sequences.append(ids + [tokenizer.eos_token_id])
    width = max(map(len, sequences))
    ids = torch.tensor([s + [tokenizer.pad_token_id] * (width - len(s)) for s in sequences])
    labels = torch.tensor([s + [-100] * (width - len(s)) for s in sequences])
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
    model.save_pretrained(model_dir, safe_serialization=True)


def run_example(root: Path, name: str, prompts: Path, model: Path, extra: list[str]) -> dict:
    return train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
        "--eval-prompt-data", str(prompts), "--eval-interval", "2",
        "--train-mode", "fully-async", "--max-staleness", "1", "--use-tis",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "2",
        "--rollout-temperature", "1.0",
        "--custom-generate-function-path", f"examples.agentic.{name}.agent:generate",
        "--custom-rm-path", f"examples.agentic.{name}.agent:reward",
        "--engine-type", "cpu", "--micro-batch-size", "8", "--lr", "1e-5", *extra,
    ], import_dirs=(ROOT,))


def spans(mask: list[int], value: int) -> list[tuple[int, int]]:
    """[start, end) runs of ``value`` in ``mask``."""
    out, start = [], None
    for k, m in enumerate([*mask, None]):
        if m == value and start is None:
            start = k
        elif m != value and start is not None:
            out.append((start, k))
            start = None
    return out


@pytest.fixture(scope="module")
def search_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("search-smoke")
    data = root / "data"
    search_prepare.main(["--out", str(data), "--heldout-people", "2"])
    sft = read_jsonl(data / "sft.jsonl")[:4]
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in read_jsonl(data / "train.jsonl")[:4]))
    model = build_tiny_model(root / "model", seed=0, corpus=(data / "tokenizer_corpus.txt").read_text().splitlines())
    fit(model, sft)
    result = run_example(root, "search", prompts, model, [
        "--rollout-max-response-len", "48", "--custom-config-path", str(data / "settings.yaml")])
    return {**result, "model": model}


def test_the_search_agent_searches_and_logs_searches_and_turns(search_run):
    steps = [m for m in search_run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0]
    # a step's rollout window may hold no finished group (fully async): its row has no rollout means
    logged = [m for m in search_run["metrics"] if "rollout/reward_mean" in m]
    assert logged and all(m["rollout/searches"] > 0 and m["rollout/turns"] >= 2 for m in logged)
    evals = [m for m in search_run["metrics"] if "eval/reward_mean" in m]
    assert evals and all(m["eval/searches"] >= 1 for m in evals)
    assert "router/prefix_cache_hit_rate" in search_run["metrics"][-1] or any(
        "router/prefix_cache_hit_rate" in m for m in search_run["metrics"])


def test_retrieved_passages_are_observations_and_the_reward_is_the_exact_match(search_run):
    from examples.agentic.search import task

    tokenizer = AutoTokenizer.from_pretrained(search_run["model"])
    searched = [s for s in search_run["samples"] if s["metadata"]["metrics"]["searches"] > 0]
    assert searched
    for sample in search_run["samples"]:
        response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
        mask = sample["loss_mask"]
        observations = [tokenizer.decode(response[a:b]) for a, b in spans(mask, 0)]
        assert len(observations) == sample["metadata"]["metrics"]["searches"]
        assert all(o.startswith("<information>") and o.endswith("</information>") for o in observations)
        # no retrieved block is attributed to the model (the tiny model may itself write an
        # "<information>" tag: that is model text, and trained as such)
        model_text = "".join(tokenizer.decode(response[a:b]) for a, b in spans(mask, 1))
        assert not any(o in model_text for o in observations)
        assert all(sample["rollout_logprobs"][k] == 0.0 for k, m in enumerate(mask) if m == 0)
        # a training sample whose search retrieved its answer's passage earns prepare.py's credit
        found = any(sample["metadata"]["evidence"] in o for o in observations)
        assert sample["metadata"]["metrics"]["evidence"] == int(found)
        assert sample["reward"] == task.grade(sample["response"], sample["label"], evidence_found=found,
                                              evidence_credit=0.25)
    assert any(s["reward"] == 1.0 for s in search_run["samples"])


@pytest.fixture(scope="module")
def multi_agent_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi-agent-smoke")
    data = root / "data"
    multi_prepare.main(["--out", str(data), "--train", "6", "--heldout", "2"])
    model = build_tiny_model(root / "model", seed=0, corpus=(data / "tokenizer_corpus.txt").read_text().splitlines())
    fit(model, read_jsonl(data / "sft.jsonl"))
    result = run_example(root, "multi_agent", data / "train.jsonl", model, ["--rollout-max-response-len", "8"])
    return {**result, "model": model}


def test_one_sample_holds_solver_critic_and_revision_with_the_role_prompts_untrained(multi_agent_run):
    tokenizer = AutoTokenizer.from_pretrained(multi_agent_run["model"])
    steps = [m for m in multi_agent_run["metrics"] if "train/pg_loss" in m]
    assert [m["train/version"] for m in steps] == [1.0, 2.0]
    logged = [m for m in multi_agent_run["metrics"] if "rollout/reward_mean" in m]
    assert logged and all("rollout/final_correct" in m and "rollout/critic_no" in m for m in logged)
    assert all(m["rollout/turns"] == 3.0 for m in logged)
    for sample in multi_agent_run["samples"]:
        response = sample["tokens"][len(sample["tokens"]) - sample["response_length"]:]
        observations = [tokenizer.decode(response[a:b]) for a, b in spans(sample["loss_mask"], 0)]
        assert observations == [multi_task.CRITIC_PROMPT + "\n", multi_task.REVISE_PROMPT + "\n"]
        turns = [tokenizer.decode(response[a:b]) for a, b in spans(sample["loss_mask"], 1)]
        assert len(turns) == 3
        assert sample["reward"] == multi_task.grade(turns[2], sample["label"])
