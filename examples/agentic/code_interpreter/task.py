"""The code-interpreter task: arithmetic the model cannot do in its head, so it must run code.

A problem is an expression of three numbers and two operations, at most one of them a
multiplication: ``What is 347*29+812?``. The answer (up to six digits, maybe negative) is beyond
a tiny model's mental arithmetic; what it can learn is the tool-use protocol:

    ```python                      <- model turn (trained), ends at the closing fence
    print(347*29+812)
    ```
    ```output                      <- the sandbox's stdout, appended as an observation (never trained)
    10875
    ```
    \\boxed{10875}                  <- final model turn (trained), ends with EOS

graded by exact match of the last ``\\boxed{}`` with the answer. Generation is deterministic in
the seed; training and held-out problems never share an expression.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

CODE_OPEN = "```python\n"
CODE_CLOSE = "\n```"  # the stop string of a code turn (the opening fence has no newline before it)
OUTPUT_LIMIT = 200  # characters of tool output shown to the model
# What a chat model is told (chat prompts only; the tiny model learns the format from the warm start).
SYSTEM_PROMPT = ("Solve the arithmetic with Python: write one ```python block that prints the result. "
                 "Its output comes back in an ```output block. Then give the final answer as \\boxed{N}.")


@dataclass(frozen=True)
class Problem:
    expression: str  # Python syntax, digits and + - * only: "347*29+8125"
    answer: int

    @property
    def question(self) -> str:
        return f"What is {self.expression}?"


def make_problem(rng: random.Random) -> Problem:
    """Three-, two- and three-digit numbers, two operations, at most one ``*`` (answers have at
    most six digits). Every expression has the same length, ten characters: the tiny model
    learns to copy it into code much faster when the copy is a fixed distance back."""
    first = rng.choice("+-*")
    second = rng.choice("+-" if first == "*" else "+-*")
    a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
    expression = f"{a}{first}{b}{second}{c}"
    return Problem(expression, evaluate(expression))


def evaluate(expression: str) -> int:
    """The value of an expression of non-negative integers and + - * (precedence as in Python)."""
    if not re.fullmatch(r"\d+(?:[-+*]\d+)*", expression):
        raise ValueError(f"not an expression of integers and + - *: {expression!r}")
    total = 0
    for term_sign, term in _terms(expression):
        value = 1
        for factor in term.split("*"):
            value *= int(factor)
        total += term_sign * value
    return total


def _terms(expression: str) -> list[tuple[int, str]]:
    """``"3*4-5+6"`` -> ``[(1, "3*4"), (-1, "5"), (1, "6")]``."""
    parts = re.split(r"([-+])", expression)
    signs = [1] + [1 if op == "+" else -1 for op in parts[1::2]]
    return list(zip(signs, parts[0::2]))


def split(seed: int, train: int, heldout: int,
          keep: Callable[[Problem], bool] | None = None) -> tuple[list[Problem], list[Problem]]:
    """``(train, heldout)`` problems with distinct expressions (only those ``keep`` accepts, when
    given), deterministic in ``seed``."""
    rng = random.Random(seed)
    problems: list[Problem] = []
    seen: set[str] = set()
    while len(problems) < train + heldout:
        problem = make_problem(rng)
        if (keep is None or keep(problem)) and problem.expression not in seen:
            seen.add(problem.expression)
            problems.append(problem)
    return problems[heldout:], problems[:heldout]


def code_turn(problem: Problem) -> str:
    """The model's tool call for ``problem``, up to and including the stop string."""
    return f"{CODE_OPEN}print({problem.expression}){CODE_CLOSE}"


def observation(stdout: str, stderr: str = "", exit_code: int = 0, killed_reason: str | None = None) -> str:
    """What the model sees after a code turn: the output (or the error's last line), fenced."""
    text = stdout
    if exit_code != 0 or killed_reason:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        text = (lines[-1] if lines else f"error: {killed_reason or f'exit code {exit_code}'}") + "\n"
    text = text[:OUTPUT_LIMIT]
    if not text.endswith("\n"):
        text += "\n"
    return f"\n```output\n{text}```\n"


def answer_turn(answer: int | str) -> str:
    return f"\\boxed{{{answer}}}"


def trace_segments(problem: Problem) -> list[dict]:
    """The supervised trace of one problem, as ``--loss-type sft`` label segments: the tool's
    output is not trained (the model never writes it; it reads it)."""
    return [{"text": code_turn(problem), "train": True},
            {"text": observation(f"{problem.answer}\n"), "train": False},
            {"text": answer_turn(problem.answer), "train": True}]


def extract_code(turn: str) -> str | None:
    """The code of a turn's ```python block, None when the turn has no closed block."""
    start = turn.find(CODE_OPEN)
    if start < 0:
        return None
    end = turn.find(CODE_CLOSE, start + len(CODE_OPEN) - 1)
    return turn[start + len(CODE_OPEN):end] if end >= 0 else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (no nested braces in this task), stripped."""
    matches = re.findall(r"\\boxed\{([^{}]*)\}", text)
    return matches[-1].strip() if matches else None


def grade(response: str, label: str) -> float:
    """1.0 when the last boxed answer is exactly the label, else 0.0."""
    return 1.0 if last_boxed(response) == str(label).strip() else 0.0
