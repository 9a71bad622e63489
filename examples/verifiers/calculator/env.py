"""A multi-turn tool verifiers environment, written as a verifiers author writes one: arithmetic
the model cannot do in its head, with a calculator tool. ``load_environment`` builds a
``vf.ToolEnv`` (the tool is a plain Python function; verifiers makes its schema from the
signature and docstring) with its own dataset and eval dataset (made here by code: nothing is
downloaded) and a rubric whose reward is the exact match of the final answer; ToolEnv adds its
own monitors (``total_tool_calls``, ``calculator_calls``, ``num_turns``).

The expression is quoted in the question (``Compute "583*81+203".``) as it is in the call's JSON
arguments, every expression is ``a*b+c`` with three, two and three digits, and every answer has
five digits: the call and the answer are then copies a small model learns (see the example's
README; with ``a*b±c`` the tiny model copied every digit but not the sign, and GRPO did not fix it).

    vf.load_environment("examples.verifiers.calculator.env", num_train=20000, num_eval=128)
"""

from __future__ import annotations

import random
import re

import verifiers as vf
from datasets import Dataset

EXPRESSION = re.compile(r"\d+(?:[*+-]\d+)*")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with +, - and *.

    Args:
        expression: the expression, e.g. 12*34-5
    """
    expression = expression.strip()
    if not EXPRESSION.fullmatch(expression):
        return "error: only integers with +, - and * are allowed"
    return str(eval(expression, {"__builtins__": {}}))  # only digits and + - * reach here


def problems(count: int, seed: int) -> list[tuple[str, int]]:
    """``count`` distinct ``(a*b+c, value)`` with five-digit values, deterministic in ``seed``."""
    rng = random.Random(seed)
    out: dict[str, int] = {}
    while len(out) < count:
        a, b, c = rng.randint(100, 999), rng.randint(10, 99), rng.randint(100, 999)
        expression = f"{a}*{b}+{c}"
        value = eval(expression)
        if 10000 <= value <= 99999:
            out.setdefault(expression, value)
    return list(out.items())


def exact_answer(parser: vf.Parser, completion: vf.Messages, answer: str) -> float:
    """1 when the final answer is the expression's value, else 0."""
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(num_train: int = 20000, num_eval: int = 128, seed: int = 0, max_turns: int = 3) -> vf.Environment:
    drawn = problems(num_train + num_eval, seed)
    heldout, train = drawn[:num_eval], drawn[num_eval:]

    def rows(items: list[tuple[str, int]]) -> Dataset:
        return Dataset.from_list([{"question": f'Compute "{expression}".', "answer": str(value)}
                                  for expression, value in items])

    parser = vf.Parser()
    rubric = vf.Rubric(funcs=[exact_answer], parser=parser)
    return vf.ToolEnv(tools=[calculator], max_turns=max_turns, dataset=rows(train), eval_dataset=rows(heldout),
                      parser=parser, rubric=rubric)
