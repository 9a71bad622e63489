"""The multi-agent example's task: reverse a string of digits in three roles — a solver answers
(sampled, so its first answer is noisy), a critic says whether that answer is right, the solver
revises — all played by the policy, rewarded on the revised answer only.

One sample holds the whole exchange (plain-text prompts; chat prompts render the same roles as
user turns):

    Solver, reverse 40721:\\n          <- prompt
    12704\\n                           <- solver (model)
    Critic, is it right?\\n            <- observation
    yes\\n                             <- critic (model)
    Solver, your final answer:\\n      <- observation
    12704\\n                           <- revision (model), graded

The warm-start traces make the first answer wrong half the time (one digit changed), the critic
say ``no`` exactly then, and the revision right; a wrong first answer is not trained on.
"""

from __future__ import annotations

import random
import re

CRITIC_PROMPT = "Critic, is it right?"
REVISE_PROMPT = "Solver, your final answer:"


def problem(digits: str) -> str:
    return f"Solver, reverse {digits}:"


def make_strings(seed: int, count: int, min_len: int = 3, max_len: int = 5) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < count:
        text = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len)))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def corrupt(answer: str, rng: random.Random) -> str:
    """``answer`` with one digit replaced by another (always different from ``answer``)."""
    k = rng.randrange(len(answer))
    return answer[:k] + rng.choice([d for d in "0123456789" if d != answer[k]]) + answer[k + 1:]


def trace(digits: str, rng: random.Random, noise: float = 0.5) -> list[tuple[str, bool]]:
    """A warm-start trace as ``(text, trained)`` segments of the model's three turns and the two
    role prompts between them (observations, never trained)."""
    right = digits[::-1]
    first = corrupt(right, rng) if rng.random() < noise else right
    return [
        (first + "\n", first == right),  # a wrong first answer is shown, not taught
        (CRITIC_PROMPT + "\n", False),
        (("yes" if first == right else "no") + "\n", True),
        (REVISE_PROMPT + "\n", False),
        (right + "\n", True),
    ]


_LINE = re.compile(r"\s*(\S*)")


def first_word(turn_text: str) -> str:
    return _LINE.match(turn_text).group(1)


def grade(final_turn: str, label: str) -> float:
    """1.0 when the revised answer (its first word) is the label."""
    return float(first_word(final_turn) == label)
