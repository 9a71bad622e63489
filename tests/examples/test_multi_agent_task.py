"""The multi-agent example's task (examples/agentic/multi_agent): traces, grader, role prompts."""

from __future__ import annotations

import json
import random

from examples.agentic.multi_agent import agent, prepare, task
from examples.models.tiny import train_tokenizer


def test_corrupt_changes_exactly_one_digit():
    rng = random.Random(0)
    for answer in ("013", "98765", "5555"):
        for _ in range(20):
            wrong = task.corrupt(answer, rng)
            assert len(wrong) == len(answer)
            assert sum(a != b for a, b in zip(wrong, answer)) == 1


def test_a_trace_with_a_right_first_answer_trains_all_three_turns():
    rng = random.Random(0)
    assert task.trace("310", rng, noise=0.0) == [
        ("013\n", True), ("Critic, is it right?\n", False), ("yes\n", True),
        ("Solver, your final answer:\n", False), ("013\n", True)]


def test_a_wrong_first_answer_is_shown_not_trained_and_the_critic_says_no():
    segments = task.trace("310", random.Random(0), noise=1.0)
    (first, first_trained), _, (verdict, _), _, (final, _) = segments
    assert first != "013\n" and not first_trained
    assert verdict == "no\n" and final == "013\n"


def test_grade_reads_the_first_word_of_the_revision():
    assert task.grade("013\n", "013") == 1.0
    assert task.grade(" 013 and more", "013") == 1.0
    assert task.grade("0134\n", "013") == 0.0
    assert task.grade("", "013") == 0.0


def test_role_prompts_in_plain_text_and_through_a_chatml_template():
    tokenizer = train_tokenizer(vocab_size=400, seed=0)
    assert agent.role_prompt(tokenizer, "Critic, is it right?", chat=False) == "Critic, is it right?\n"
    rendered = agent.role_prompt(tokenizer, "Critic, is it right?", chat=True)
    assert rendered == "<|im_end|>\n<|im_start|>user\nCritic, is it right?<|im_end|>\n<|im_start|>assistant\n"
    assert agent.turn_end(tokenizer, rendered) == "<|im_end|>"
    # the model ended its turn with <|im_end|> itself: it is not appended twice
    assert agent.role_prompt(tokenizer, "Critic, is it right?", chat=True, ended_with="<|im_end|>") == rendered[10:]


def test_chat_traces_end_each_model_turn_with_the_templates_end_token(tmp_path):
    from examples.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0)
    prepare.main(["--out", str(tmp_path / "data"), "--train", "4", "--heldout", "1", "--chat-tokenizer", str(model)])
    row = json.loads((tmp_path / "data" / "sft.jsonl").read_text().splitlines()[0])
    assert row["prompt"][0]["role"] == "user"
    texts = [s["text"] for s in row["label"]]
    assert texts[0].endswith("<|im_end|>") and texts[2] in ("yes<|im_end|>", "no<|im_end|>")
    assert texts[1] == "\n<|im_start|>user\nCritic, is it right?<|im_end|>\n<|im_start|>assistant\n"
    assert [s["train"] for s in row["label"]][1:] == [False, True, False, True]


def test_prepare_writes_prompts_labels_and_traces(tmp_path):
    prepare.main(["--out", str(tmp_path), "--train", "10", "--heldout", "3"])
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    sft = [json.loads(line) for line in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert len(train) == 10 and len((tmp_path / "heldout.jsonl").read_text().splitlines()) == 3
    digits = train[0]["prompt"].split("reverse ")[1].split(":")[0]
    assert train[0]["label"] == digits[::-1]
    assert sft[0]["label"][-1] == {"text": digits[::-1] + "\n", "train": True}
