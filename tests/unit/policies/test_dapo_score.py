"""DAPO's math score: +1 / -1 on the final answer, read from the end of the solution."""

from __future__ import annotations

import pytest

from policies.dapo_score import TAIL_CHARS, dapo_score, normalize_final_answer
from slime_async.compat.slime.rollout.rm_hub.math_dapo_utils import compute_score


def test_strict_box_verify_takes_the_last_box_and_needs_an_exact_match():
    assert dapo_score("first \\boxed{3} then Answer: \\boxed{4}", "4", strict_box_verify=True) == {
        "score": 1.0, "acc": True, "pred": "4"}
    assert dapo_score("Answer: \\boxed{4.0}", "4", strict_box_verify=True) == {
        "score": -1.0, "acc": False, "pred": "4.0"}
    assert dapo_score("no box at all", "4", strict_box_verify=True) == {"score": -1.0, "acc": False, "pred": None}


def test_without_strict_box_the_last_answer_line_is_normalised():
    assert dapo_score("Answer: 3\nwait.\nAnswer: $1,000$.", "1000")["acc"] is True
    assert dapo_score("Answer: \\text{7}", "7")["score"] == 1.0
    assert dapo_score("The result is 7", "7") == {"score": -1.0, "acc": False, "pred": None}


def test_only_the_tail_of_a_long_solution_is_read():
    solution = "Answer: \\boxed{5}" + "x" * TAIL_CHARS
    assert dapo_score(solution, "5", strict_box_verify=True)["pred"] is None


@pytest.mark.parametrize(("raw", "normal"), [("$\\boxed{12}$.", "12"), (" 1,234,567 ", "1234567"),
                                             ("\\text{cat} s", "cats"), ("1,2", "1,2")])
def test_normalize_final_answer(raw, normal):
    assert normalize_final_answer(raw) == normal


def test_slimes_import_path_and_signature_give_the_same_score():
    assert compute_score("Answer: \\boxed{4}", "4", strict_box_verify=True) == dapo_score(
        "Answer: \\boxed{4}", "4", strict_box_verify=True)
