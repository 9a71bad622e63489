"""reasoning-gym as a data and reward source: rows carry the entry, the generator's own scorer
is the reward (--rm-type reasoning_gym), and bad names, configs or a missing package fail in one line."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from actors.loop.run_config import parse_run_config
from actors.rollout import reasoning_gym as rgym
from actors.rollout.config import RolloutConfig
from actors.rollout.rewards import RewardScorer
from slime_async.config.flags import ConfigError
from slime_async.config.loader import preflight
from slime_async.sample import Sample, Status

CHAIN_SUM = {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 1}


class Ctx:
    tokenizer = None


def known_row() -> dict:
    """chain_sum's first entry at seed 1, read back from JSON as the rollout reads a row."""
    (row,) = rgym.rows("chain_sum", CHAIN_SUM, size=1, seed=1)
    return json.loads(json.dumps(row))


def test_a_row_carries_the_question_the_tagged_answer_and_the_entry():
    row = known_row()
    entry = row["metadata"]["reasoning_gym"]["entry"]
    # Worked out by running reasoning-gym 0.1.25's chain_sum at seed 1: 4 - 1 - 7 = -4.
    assert entry["question"] == "State the final answer to the following arithmetic problem: 4 - 1 - 7 ="
    assert entry["answer"] == "-4"
    assert row["prompt"] == entry["question"] + "\nPut the final answer in <answer></answer> tags."
    assert row["label"] == "<answer>-4</answer>"
    assert row["metadata"]["reasoning_gym"]["dataset"] == "chain_sum"
    assert row["metadata"]["reasoning_gym"]["config"] == {**CHAIN_SUM, "size": 1, "seed": 1}


@pytest.mark.parametrize("response, reward, exact", [
    ("so <answer>-4</answer>", 1.0, 1.0),              # the oracle answer
    ("<answer>5</answer>", 0.0, 0.0),                   # wrong
    ("<answer>x-4</answer>", 2 / 3, 0.0),               # contains the oracle: len("-4") / len("x-4"), not exact
    ("-4", 0.0, 0.0),                                   # no tag: nothing extracted
    ("<answer>1</answer> then <answer>-4</answer>", 1.0, 1.0),  # the last tag counts
])
def test_the_reward_is_the_generators_own_score_and_exact_match_is_logged_beside_it(response, reward, exact):
    scorer = RewardScorer(RolloutConfig(rm_type="reasoning_gym"), Ctx())
    sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 2], response_length=1, loss_mask=[1],
                    rollout_logprobs=[0.0], token_versions=[0], status=Status.COMPLETED,
                    metadata=known_row()["metadata"])
    sample.response = response
    assert asyncio.run(scorer.score_group([sample]))
    scorer.close()
    assert sample.reward == pytest.approx(reward)
    assert sample.metadata["metrics"] == {"exact_match": exact}  # averaged into rollout/ and eval/exact_match


def test_a_row_without_the_entry_is_a_counted_reward_error():
    scorer = RewardScorer(RolloutConfig(rm_type="reasoning_gym"), Ctx())
    sample = Sample(group_index=0, index=0, prompt="p", tokens=[1, 2], response_length=1, loss_mask=[1],
                    rollout_logprobs=[0.0], token_versions=[0], status=Status.COMPLETED)
    sample.response = "<answer>1</answer>"
    asyncio.run(scorer.score_group([sample]))
    scorer.close()
    assert scorer.errors == 1 and "prepare-reasoning-gym" in sample.metadata["reward_error"]


def test_prepare_writes_disjoint_train_and_heldout_sets(tmp_path, capsys):
    assert rgym.main(["--dataset", "chain_sum", "--config", json.dumps(CHAIN_SUM), "--train-size", "300",
                      "--heldout-size", "50", "--out", str(tmp_path)]) == 0
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    heldout = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(heldout) == 50 and 0 < len(train) <= 300
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in heldout})
    assert {r["metadata"]["reasoning_gym"]["config"]["seed"] for r in heldout} == {1}
    assert f"wrote {len(train)} training and 50 held-out" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "chain_sm"], "error: reasoning-gym has no generator 'chain_sm': did you mean chain_sum"),
    (["--dataset", "chain_sum", "--config", '{"terms": 2}'], "error: reasoning-gym generator 'chain_sum': bad config"),
    (["--dataset", "chain_sum", "--config", '{"min_terms": 0}'],
     "error: reasoning-gym generator 'chain_sum': invalid config (min_terms must be positive)"),
    (["--dataset", "chain_sum", "--config", "{"], "error: --config is not JSON"),
])
def test_a_bad_generator_or_config_fails_in_one_line(tmp_path, capsys, argv, message):
    assert rgym.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_rm_type_reasoning_gym_without_the_package_fails_at_start(tmp_path, monkeypatch):
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps(known_row()) + "\n")
    from examples.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=0)
    config = parse_run_config(["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rm-type", "reasoning_gym"])
    preflight(config)  # installed: passes
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # what an environment without the extra imports
    with pytest.raises(ConfigError, match=r"--rm-type reasoning_gym: reasoning-gym is not installed: pip install"):
        preflight(config)
