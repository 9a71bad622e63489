"""A single-turn verifiers environment, written as a verifiers author writes one: reverse a string
of digits (the quick start's task, as a chat). ``load_environment`` builds a ``vf.SingleTurnEnv``
with its own dataset and eval dataset (made here by code: nothing is downloaded), a parser and a
rubric whose one reward function is the exact match of the parsed answer.

    vf.load_environment("examples.verifiers.reverse_digits.env", num_train=4000, num_eval=128)
"""

from __future__ import annotations

import random

import verifiers as vf
from datasets import Dataset


def digit_strings(count: int, seed: int, min_len: int, max_len: int) -> list[str]:
    """``count`` distinct digit strings, deterministic in ``seed``."""
    rng = random.Random(seed)
    strings: list[str] = []
    seen: set[str] = set()
    while len(strings) < count:
        text = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len)))
        if text not in seen:
            seen.add(text)
            strings.append(text)
    return strings


def exact_answer(parser: vf.Parser, completion: vf.Messages, answer: str) -> float:
    """1 when the model's answer is the reversed string, else 0."""
    return 1.0 if (parser.parse_answer(completion) or "").strip() == answer else 0.0


def load_environment(num_train: int = 4000, num_eval: int = 128, seed: int = 0, min_len: int = 3,
                     max_len: int = 5) -> vf.Environment:
    strings = digit_strings(num_train + num_eval, seed, min_len, max_len)
    heldout, train = strings[:num_eval], strings[num_eval:]

    def rows(texts: list[str]) -> Dataset:
        return Dataset.from_list([{"question": f"reverse {text}:", "answer": text[::-1]} for text in texts])

    parser = vf.Parser()
    rubric = vf.Rubric(funcs=[exact_answer], parser=parser)
    return vf.SingleTurnEnv(dataset=rows(train), eval_dataset=rows(heldout), parser=parser, rubric=rubric)
