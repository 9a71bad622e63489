"""Arithmetic word problems at graded difficulty, for RL on a small pretrained chat model.

Levels (every answer is a non-negative integer; the ladder is pitched at SmolLM2-135M, whose
greedy answer to "13 + 2" is right only some of the time):

    1  one 1-digit addition or subtraction          "Mia has 7 shells. Mia finds 5 more shells. ..."
    2  one 2-digit ± 1-digit step                   "Tom has 48 cards. Tom sells 9 cards. ..."
    3  one 2-digit ± 2-digit step (carries, borrows)
    4  two steps in a row: 2-digit ± 2-digit ± 1-digit
    5  a small multiplication, then an addition or subtraction: "3 bags with 6 marbles in each ..."

Generation is deterministic in the seed. Held-out and training never share a problem: two
problems are the same when they have the same level, operations and numbers, whatever the
names, objects and verbs (so at level 1, whose number space is small, the held-out sums are
never seen in training in any wording). Within the training split only the wording must differ.

A row in the project's prompt format: ``{"prompt": [chat messages], "label": "12",
"metadata": {"level": 1, "expression": "7 + 5"}}``. The messages are one worked example (a user
turn and the assistant's answer, which shows the format: the arithmetic in one line, then
``\boxed{}``) followed by the problem as a user turn. Without the example the model rambles
for a hundred tokens and rarely boxes anything; with it, nearly every answer is one short
boxed line and what remains wrong is the choice of operation and the arithmetic, which is
what RL has to fix. The run renders the messages with the model's chat template
(``apply_chat_template = true``) and ``--rm-type math`` grades the last ``\boxed{}``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LEVELS = (1, 2, 3, 4, 5)

INSTRUCTION = "Reason briefly, then put the final answer in \\boxed{}."
# The worked example shown before every problem. It is no level's problem (two steps like level
# 4, but level 4's second number has two digits), so it never answers a held-out problem.
EXAMPLE_QUESTION = ("Tom has 23 pens. Tom gives away 5 pens. Then Tom buys 12 more pens. "
                    "How many pens does Tom have now?")
EXAMPLE_ANSWER = "23 - 5 + 12 = 30. The answer is \\boxed{30}."

NAMES = (
    "Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Nina", "Omar", "Lily", "Ben", "Ella", "Ravi", "Sofia", "Max",
    "Hana", "Jack", "Iris", "Noah", "Ruby", "Kai", "Maya", "Eli", "Lucy", "Finn",
)
# (plural noun, its container in level 5's groups)
OBJECTS = (
    ("apples", "baskets"), ("stickers", "sheets"), ("marbles", "bags"), ("pencils", "boxes"),
    ("cookies", "trays"), ("stamps", "pages"), ("shells", "jars"), ("cards", "packs"),
    ("books", "shelves"), ("coins", "purses"), ("eggs", "cartons"), ("flowers", "pots"),
    ("beads", "strings"), ("crayons", "tins"), ("buttons", "cups"), ("toy cars", "crates"),
)
GAIN_VERBS = ("finds", "buys", "gets", "is given", "picks up", "wins", "collects")
LOSE_VERBS = ("gives away", "sells", "loses", "uses", "gives a friend", "trades away", "donates")
# His/her-free phrasing so one template fits every name.
QUESTIONS = (
    "How many {obj} does {name} have now?",
    "How many {obj} does {name} have in the end?",
    "How many {obj} are left with {name}?",
    "What is the number of {obj} {name} has now?",
)


@dataclass(frozen=True)
class Problem:
    level: int
    question: str
    answer: int
    expression: str  # the arithmetic behind the words, e.g. "7 * 6 - 5"
    key: tuple  # identity for the train/held-out split: (level, operations, numbers)

    def row(self) -> dict:
        return {
            "prompt": [
                {"role": "user", "content": f"{EXAMPLE_QUESTION}\n{INSTRUCTION}"},
                {"role": "assistant", "content": EXAMPLE_ANSWER},
                {"role": "user", "content": f"{self.question}\n{INSTRUCTION}"},
            ],
            "label": str(self.answer),
            "metadata": {"level": self.level, "expression": self.expression},
        }


# ----- one step, in words -------------------------------------------------------------------


def _step(rng: random.Random, name: str, op: str, amount: int, obj: str) -> str:
    if op == "+":
        verb = rng.choice(GAIN_VERBS)
        return f"{name} {verb} {amount} more {obj}." if rng.random() < 0.5 else f"Then {name} {verb} {amount} {obj}."
    verb = rng.choice(LOSE_VERBS)
    return f"{name} {verb} {amount} {obj}." if rng.random() < 0.5 else f"Then {name} {verb} {amount} of them."


def _question(rng: random.Random, name: str, obj: str) -> str:
    return rng.choice(QUESTIONS).format(name=name, obj=obj)


def _apply(total: int, op: str, amount: int) -> int:
    return total + amount if op == "+" else total - amount


# ----- levels ---------------------------------------------------------------------------------


def _one_step(rng: random.Random, level: int, a_range: tuple[int, int], b_range: tuple[int, int]) -> Problem:
    name, (obj, _) = rng.choice(NAMES), rng.choice(OBJECTS)
    op = rng.choice("+-")
    while True:
        a, b = rng.randint(*a_range), rng.randint(*b_range)
        answer = _apply(a, op, b)
        if 0 <= answer <= 99:
            break
    text = f"{name} has {a} {obj}. {_step(rng, name, op, b, obj)} {_question(rng, name, obj)}"
    return Problem(level, text, answer, f"{a} {op} {b}", (level, op, a, b))


def _level1(rng: random.Random) -> Problem:
    return _one_step(rng, 1, (2, 9), (1, 9))


def _level2(rng: random.Random) -> Problem:
    return _one_step(rng, 2, (10, 89), (2, 9))


def _level3(rng: random.Random) -> Problem:
    return _one_step(rng, 3, (10, 89), (10, 89))


def _level4(rng: random.Random) -> Problem:
    name, (obj, _) = rng.choice(NAMES), rng.choice(OBJECTS)
    ops = rng.choice(("+-", "-+", "++", "--"))
    while True:
        a, b, c = rng.randint(20, 89), rng.randint(10, 40), rng.randint(2, 9)
        middle = _apply(a, ops[0], b)
        answer = _apply(middle, ops[1], c)
        if 0 <= middle <= 99 and 0 <= answer <= 99:
            break
    steps = f"{_step(rng, name, ops[0], b, obj)} {_step(rng, name, ops[1], c, obj)}"
    text = f"{name} has {a} {obj}. {steps} {_question(rng, name, obj)}"
    return Problem(4, text, answer, f"{a} {ops[0]} {b} {ops[1]} {c}", (4, ops, a, b, c))


def _groups(rng: random.Random, name: str, groups: int, size: int, obj: str, container: str) -> str:
    return rng.choice((
        f"{name} has {groups} {container} with {size} {obj} in each.",
        f"{name} has {groups} {container}, and each one holds {size} {obj}.",
        f"{name} fills {groups} {container} with {size} {obj} each.",
    ))


def _level5(rng: random.Random) -> Problem:
    name, (obj, container) = rng.choice(NAMES), rng.choice(OBJECTS)
    op = rng.choice("+-")
    while True:
        groups, size, c = rng.randint(2, 6), rng.randint(2, 10), rng.randint(2, 9)
        answer = _apply(groups * size, op, c)
        if answer >= 0:
            break
    text = f"{_groups(rng, name, groups, size, obj, container)} {_step(rng, name, op, c, obj)} " \
           f"{_question(rng, name, obj)}"
    return Problem(5, text, answer, f"{groups} * {size} {op} {c}", (5, op, groups, size, c))


GENERATORS: dict[int, Callable[[random.Random], Problem]] = {
    1: _level1, 2: _level2, 3: _level3, 4: _level4, 5: _level5,
}


# ----- splits ---------------------------------------------------------------------------------


def generate(level: int, rng: random.Random) -> Problem:
    if level not in GENERATORS:
        raise ValueError(f"level must be one of {LEVELS}, got {level}")
    return GENERATORS[level](rng)


def make_split(counts: dict[int, int], seed: int, exclude: Iterable[tuple] = (),
               distinct_numbers: bool = True) -> list[Problem]:
    """``counts[level]`` problems per level, none whose key is in ``exclude``, levels interleaved
    in a fixed shuffled order. ``distinct_numbers``: no two share a key (same level, operations,
    numbers); otherwise only no two share a question text. Deterministic in the arguments."""
    rng = random.Random(seed)
    excluded = set(exclude)
    seen: set = set()
    problems: list[Problem] = []
    for level in sorted(counts):
        made, attempts = 0, 0
        while made < counts[level]:
            attempts += 1
            if attempts > 50 * counts[level] + 1000:
                raise ValueError(f"level {level}: cannot draw {counts[level]} distinct problems")
            problem = generate(level, rng)
            identity = problem.key if distinct_numbers else problem.question
            if problem.key in excluded or identity in seen:
                continue
            seen.add(identity)
            problems.append(problem)
            made += 1
    rng.shuffle(problems)
    return problems


def spread(total: int, weights: dict[int, float]) -> dict[int, int]:
    """Split ``total`` over levels in proportion to ``weights`` (largest remainders), exactly."""
    norm = sum(weights.values())
    raw = {level: total * w / norm for level, w in weights.items()}
    counts = {level: int(r) for level, r in raw.items()}
    for level in sorted(raw, key=lambda k: (counts[k] - raw[k], k))[: total - sum(counts.values())]:
        counts[level] += 1
    return counts


def make_task(train: int, heldout: int, seed: int, train_weights: dict[int, float] | None = None,
              heldout_weights: dict[int, float] | None = None) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) problems; held-out is drawn first and excluded from training."""
    uniform = {level: 1.0 for level in LEVELS}
    held = make_split(spread(heldout, heldout_weights or uniform), seed=seed * 2 + 1)
    trained = make_split(spread(train, train_weights or uniform), seed=seed * 2, exclude=(p.key for p in held),
                         distinct_numbers=False)
    return trained, held
