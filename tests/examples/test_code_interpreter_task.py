"""The code-interpreter task (examples/agentic/code_interpreter/task.py), its data writers and the
OpenAI agent's episode segments, with hand-computed values."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the examples are imported as examples.agentic.<name>

from actors.router.tool_calls import template_messages  # noqa: E402
from examples.agentic.code_interpreter import make_task, task  # noqa: E402
from examples.agentic.openai_agent import agent as openai_agent  # noqa: E402
from examples.agentic.openai_agent import make_task as openai_make_task  # noqa: E402


@pytest.mark.parametrize("expression, value", [
    ("347*29+812", 10875), ("136-88-577", -529), ("100+10*999", 10090), ("999-99*999", -97902), ("5", 5),
])
def test_expressions_evaluate_with_pythons_precedence(expression, value):
    assert task.evaluate(expression) == value


def test_anything_but_integers_and_plus_minus_times_is_refused():
    with pytest.raises(ValueError, match="not an expression"):
        task.evaluate("__import__('os')")


def test_problems_have_fixed_width_expressions_and_at_most_one_product():
    rng = random.Random(7)
    for _ in range(200):
        problem = task.make_problem(rng)
        assert len(problem.expression) == 10 and problem.expression.count("*") <= 1
        assert problem.answer == eval(problem.expression)  # noqa: S307 - digits and + - * only
        assert problem.question == f"What is {problem.expression}?"


def test_the_split_is_deterministic_and_held_out_expressions_are_never_trained_on():
    train, heldout = task.split(3, 500, 50)
    assert (train, heldout) == task.split(3, 500, 50)
    assert len(train) == 500 and len(heldout) == 50
    assert not {p.expression for p in train} & {p.expression for p in heldout}
    assert len({p.expression for p in train}) == 500


def test_a_code_turn_is_a_python_block_that_ends_with_the_stop_string():
    turn = task.code_turn(task.Problem("347*29+812", 10875))
    assert turn == "```python\nprint(347*29+812)\n```" and turn.endswith(task.CODE_CLOSE)
    assert task.extract_code(turn) == "print(347*29+812)"
    assert task.extract_code("```python\n```") == ""
    assert task.extract_code("```python\nprint(1)") is None and task.extract_code("\\boxed{3}") is None


def test_the_observation_shows_stdout_or_the_errors_last_line():
    assert task.observation("10875\n") == "\n```output\n10875\n```\n"
    assert task.observation("", "Traceback ...\nZeroDivisionError: division by zero\n", 1) == \
        "\n```output\nZeroDivisionError: division by zero\n```\n"
    assert task.observation("", "", None, "timeout") == "\n```output\nerror: timeout\n```\n"
    assert task.observation("7" * 500) == "\n```output\n" + "7" * task.OUTPUT_LIMIT + "\n```\n"


def test_grading_is_an_exact_match_of_the_last_boxed_answer():
    assert task.grade("```output\n-529\n```\n\\boxed{-529}", "-529") == 1.0
    assert task.grade("\\boxed{1} then \\boxed{ 12 }", "12") == 1.0
    assert task.grade("\\boxed{12.0}", "12") == 0.0
    assert task.grade("12", "12") == 0.0


def test_sft_traces_train_the_calls_and_the_answer_but_not_the_tools_output():
    segments = task.trace_segments(task.Problem("136-88-577", -529))
    assert segments == [{"text": "```python\nprint(136-88-577)\n```", "train": True},
                        {"text": "\n```output\n-529\n```\n", "train": False},
                        {"text": "\\boxed{-529}", "train": True}]


def test_make_task_writes_disjoint_splits_sft_traces_and_a_corpus(tmp_path):
    assert make_task.main(["--out", str(tmp_path), "--train", "20", "--heldout", "5"]) == 0
    rows = {name: [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
            for name in ("train.jsonl", "heldout.jsonl", "sft.jsonl")}
    assert len(rows["train.jsonl"]) == 20 and len(rows["heldout.jsonl"]) == 5
    assert not {r["prompt"] for r in rows["train.jsonl"]} & {r["prompt"] for r in rows["heldout.jsonl"]}
    first = rows["train.jsonl"][0]
    expression = first["prompt"].removeprefix("What is ").removesuffix("?")
    assert first["label"] == str(eval(expression))  # noqa: S307
    assert rows["sft.jsonl"][0]["label"][2] == {"text": f"\\boxed{{{first['label']}}}", "train": True}
    assert f"print({expression})" in (tmp_path / "corpus.txt").read_text()


def test_make_task_writes_chat_prompts_for_a_tokenizer_with_a_chat_template(tmp_path):
    from examples.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", vocab_size=320)
    assert make_task.main(["--out", str(tmp_path / "data"), "--train", "3", "--heldout", "2",
                           "--chat-tokenizer", str(model)]) == 0
    prompt = json.loads((tmp_path / "data" / "train.jsonl").read_text().splitlines()[0])["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"] and prompt[1]["content"].startswith("What is ")


def test_make_task_refuses_a_directory_without_a_tokenizer_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        make_task.main(["--out", str(tmp_path / "data"), "--chat-tokenizer", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"--chat-tokenizer {tmp_path}: not a tokenizer directory") and "\n" not in err
    assert not (tmp_path / "data").exists()


def test_openai_episode_segments_rebuild_the_whole_rendered_episode_split_at_the_model_turns():
    tokenizer = openai_make_task.load_template_tokenizer(None)
    problem = task.Problem("136-88-577", -529)
    prompt, segments = openai_make_task.episode_segments(tokenizer, problem)
    # OpenAI's tool-call arguments are a JSON string; the front hands templates a mapping.
    messages = template_messages(openai_agent.conversation(problem))
    whole = tokenizer.apply_chat_template(messages, tools=openai_agent.TOOLS, tokenize=False)
    assert whole == prompt + "".join(s["text"] for s in segments) + "\n"
    assert prompt.endswith("<|im_start|>user\nWhat is 136-88-577?<|im_end|>\n<|im_start|>assistant\n")
    # The space before the expression is the one before it in the question (an induction copy).
    assert segments[0] == {"text": '<tool_call>\n{"name": "run_python", "arguments": {"code": "print( 136-88-577)"}}'
                                   '\n</tool_call><|im_end|>', "train": True}
    assert segments[1] == {"text": "\n<|im_start|>user\n<tool_response>\n-529\n</tool_response><|im_end|>\n"
                                   "<|im_start|>assistant\n", "train": False}
    assert segments[2] == {"text": "\\boxed{-529}<|im_end|>", "train": True}


def test_the_openai_agents_tool_output_is_stdout_or_the_errors_last_line():
    assert openai_agent.tool_output("10875\n") == "10875"
    assert openai_agent.tool_output("", "x\nNameError: name 'y' is not defined\n", 1) == "NameError: name 'y' is not defined"
    assert openai_agent.tool_output("", "", None, "timeout") == "error: timeout"


def test_openai_problems_all_have_positive_answers_of_the_asked_length_and_distinct_expressions():
    train, heldout = openai_make_task.split(0, 300, 20, answer_digits=5)
    assert len(train) == 300 and len(heldout) == 20
    assert all(10000 <= p.answer <= 99999 and "*" in p.expression for p in train + heldout)
    assert len({p.expression for p in train + heldout}) == 320
    assert openai_make_task.split(0, 300, 20, 5) == (train, heldout)  # deterministic in the seed
    assert all(100 <= p.answer <= 999 for p in sum(openai_make_task.split(1, 50, 5, answer_digits=3), []))


def test_openai_make_task_refuses_an_answer_length_the_problems_cannot_have(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        openai_make_task.main(["--out", str(tmp_path / "data"), "--answer-digits", "6"])
    assert exit_info.value.code == 2
    assert "--answer-digits must be 3, 4 or 5, got 6" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
