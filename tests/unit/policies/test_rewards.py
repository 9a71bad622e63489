"""Rule-based reward functions."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from policies.rewards import (
    BUILTIN_REWARDS,
    exact_match_reward,
    f1_reward,
    no_reward,
    last_boxed,
    math_reward,
)


def test_last_boxed_returns_the_content_of_the_last_box_with_nested_braces():
    assert last_boxed(r"first \boxed{1}, then \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"


def test_last_boxed_of_a_cut_off_box_is_none():
    assert last_boxed(r"so \boxed{\frac{1}{2") is None
    assert last_boxed("no box here") is None


def test_math_reward_accepts_an_equivalent_boxed_answer():
    assert math_reward(r"Half of one is \boxed{\frac{1}{2}}", "0.5") == 1.0


def test_math_reward_rejects_a_wrong_answer():
    assert math_reward(r"The answer is \boxed{3}", "4") == 0.0


def test_math_reward_scores_the_last_boxed_answer():
    assert math_reward(r"Maybe \boxed{3}? No: \boxed{4}", "4") == 1.0
    assert math_reward(r"Maybe \boxed{3}? No: \boxed{4}", "3") == 0.0


def test_math_reward_reads_a_final_answer_without_a_box():
    assert math_reward("Adding them up, the final answer is 42.", "42") == 1.0


def test_math_reward_of_an_answerless_or_empty_response_is_zero():
    assert math_reward("I do not know.", "7") == 0.0
    assert math_reward("", "7") == 0.0


def test_math_reward_works_from_a_worker_thread():
    # math_verify's signal-based timeout raises off the main thread unless disabled
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(math_reward, r"\boxed{\frac{1}{2}}", "1/2")
        assert future.result(timeout=60) == 1.0


def test_exact_match_ignores_case_and_whitespace():
    assert exact_match_reward("  Paris\n is  nice ", "paris is NICE") == 1.0


def test_exact_match_rejects_different_text():
    assert exact_match_reward("Paris.", "Paris") == 0.0


def test_f1_is_squad_token_overlap():
    # tokens: pred [cat, sat, on, mat] (articles dropped), gold [cat, sat]
    # common 2, P = 2/4, R = 2/2, F1 = 2·0.5·1/1.5 = 0.6666667
    assert f1_reward("The cat sat on the mat.", "a cat sat") == pytest.approx(2 / 3)


def test_f1_of_disjoint_texts_is_zero():
    assert f1_reward("dog", "cat") == 0.0


def test_f1_with_an_empty_side_is_one_only_when_both_are_empty():
    assert f1_reward("", "the") == 1.0  # both normalise to no tokens
    assert f1_reward("", "cat") == 0.0


def test_registry_maps_names_to_functions():
    assert BUILTIN_REWARDS == {"none": no_reward, "math": math_reward, "exact": exact_match_reward, "f1": f1_reward}


def test_no_reward_is_zero_whatever_the_response_and_label():
    assert no_reward("\\boxed{4}", "4") == 0.0
    assert no_reward("", None) == 0.0
