"""The SmolLM2 math example's task generator (examples/smollm2_math/task.py) and prepare.py's errors."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2_math"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"smollm2_math_{name}", EXAMPLE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


task = _load("task")


def _evaluate(expression: str) -> int:
    assert re.fullmatch(r"[0-9 +*-]+", expression)
    return eval(expression)  # noqa: S307 - digits and + - * only, checked above


def test_every_answer_is_the_value_of_its_expression_and_a_non_negative_integer():
    for level in task.LEVELS:
        for problem in task.make_split({level: 200}, seed=3, distinct_numbers=False):
            assert problem.answer == _evaluate(problem.expression) >= 0
            assert problem.level == level


def test_the_numbers_of_the_expression_appear_in_the_question():
    for problem in task.make_split({level: 20 for level in task.LEVELS}, seed=5):
        for number in re.findall(r"\d+", problem.expression):
            assert re.search(rf"\b{number}\b", problem.question), (number, problem.question)


def _terms(problem) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", problem.expression)]


def test_levels_have_the_promised_shape():
    for problem in task.make_split({1: 50}, seed=0):
        a, b = _terms(problem)
        assert 2 <= a <= 9 and 1 <= b <= 9 and re.fullmatch(r"\d+ [+-] \d+", problem.expression)
    for problem in task.make_split({2: 100}, seed=0):
        a, b = _terms(problem)
        assert 10 <= a <= 89 and 2 <= b <= 9 and problem.answer <= 99
    for problem in task.make_split({3: 100}, seed=0):
        a, b = _terms(problem)
        assert 10 <= a <= 89 and 10 <= b <= 89 and problem.answer <= 99
    for problem in task.make_split({4: 100}, seed=0):
        assert re.fullmatch(r"\d+ [+-] \d+ [+-] \d+", problem.expression)
    for problem in task.make_split({5: 100}, seed=0):
        assert re.fullmatch(r"\d \* \d+ [+-] \d", problem.expression)


def test_generation_is_deterministic_in_the_seed():
    first = task.make_task(300, 50, seed=7)
    second = task.make_task(300, 50, seed=7)
    assert first == second
    assert task.make_task(300, 50, seed=8) != first


def test_heldout_shares_no_problem_with_train():
    train, heldout = task.make_task(4000, 256, seed=0)
    assert len(train) == 4000 and len(heldout) == 256
    # same level, operations and numbers count as the same problem, whatever the wording
    assert not {p.key for p in train} & {p.key for p in heldout}
    assert len({p.key for p in heldout}) == len(heldout)
    assert len({p.question for p in train}) == len(train)


def test_heldout_is_spread_evenly_over_the_levels():
    _, heldout = task.make_task(100, 256, seed=0)
    counts = {level: sum(p.level == level for p in heldout) for level in task.LEVELS}
    assert sum(counts.values()) == 256 and max(counts.values()) - min(counts.values()) <= 1


def test_spread_splits_exactly_in_proportion():
    assert task.spread(10, {1: 1, 2: 1, 3: 2}) == {1: 3, 2: 2, 3: 5}  # the tie goes to the lower level
    assert sum(task.spread(257, {level: 1 for level in task.LEVELS}).values()) == 257


def test_a_row_is_a_user_turn_asking_for_a_boxed_answer_with_the_label_and_level():
    problem = task.make_split({4: 1}, seed=1)[0]
    row = problem.row()
    assert row["label"] == str(problem.answer)
    assert row["metadata"]["level"] == 4
    example, answer, message = row["prompt"]
    assert [m["role"] for m in row["prompt"]] == ["user", "assistant", "user"]
    assert "\\boxed{30}" in answer["content"]  # the worked example shows the format
    assert problem.question in message["content"] and "\\boxed{}" in message["content"]
    json.dumps(row)  # a JSONL row


def test_the_math_reward_scores_a_correct_boxed_answer_1_and_a_wrong_one_0():
    from policies.rewards import math_reward

    problem = task.make_split({5: 1}, seed=2)[0]
    label = problem.row()["label"]
    assert math_reward(f"First ... so the answer is \\boxed{{{problem.answer}}}.", label) == 1.0
    assert math_reward(f"So the answer is \\boxed{{{problem.answer + 1}}}.", label) == 0.0
    # the last box counts
    assert math_reward(f"\\boxed{{{problem.answer}}} no wait \\boxed{{{problem.answer + 10}}}", label) == 0.0


def _prepare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE / "prepare.py"), *args], capture_output=True, text=True)


def test_prepare_refuses_an_out_that_is_a_file_in_one_line(tmp_path):
    existing = tmp_path / "file"
    existing.write_text("x")
    done = _prepare("--out", str(existing), "--no-model")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "not a directory" in done.stderr and "Traceback" not in done.stderr


def test_prepare_refuses_an_out_it_cannot_create_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = _prepare("--out", str(blocker / "below"), "--no-model")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "cannot write" in done.stderr


def test_prepare_writes_the_data(tmp_path):
    done = _prepare("--out", str(tmp_path), "--no-model", "--train", "50", "--heldout", "10")
    assert done.returncode == 0, done.stderr
    train = [json.loads(line) for line in (tmp_path / "data" / "train.jsonl").open()]
    heldout = [json.loads(line) for line in (tmp_path / "data" / "heldout.jsonl").open()]
    assert len(train) == 50 and len(heldout) == 10
    assert "heldout.jsonl" in done.stdout and "sample" in done.stdout


def test_prepare_names_a_missing_package_in_one_line(tmp_path):
    # A cache with the .gguf but no converted model forces a conversion, which needs gguf:
    # the child is made to see it as not installed.
    cache = tmp_path / "cache"
    (cache / "SmolLM2-135M-Instruct").mkdir(parents=True)
    (cache / "SmolLM2-135M-Instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"")
    script = ("import importlib.util, runpy, sys; real = importlib.util.find_spec; "
              "importlib.util.find_spec = lambda name, *a: None if name == 'gguf' else real(name, *a); "
              f"sys.argv = ['prepare.py', '--out', {str(tmp_path / 'out')!r}]; "
              f"runpy.run_path({str(EXAMPLE / 'prepare.py')!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={"SLIME_ASYNC_CACHE": str(cache), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "gguf" in done.stderr and "pip install" in done.stderr
