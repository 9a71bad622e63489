"""Rule-based reward functions: (response_text, label) -> float.

Each is pure and synchronous; the rollout actor runs them in a worker thread so a slow one
cannot stall the event loop, which is why `math_reward` must work off the main thread.
"""

from __future__ import annotations

import re
import string
import threading
from collections import Counter
from collections.abc import Callable

RewardFn = Callable[[str, object], float]

# math_verify's timeouts rely on signal.alarm, which only the main thread may set. Off the main
# thread timeouts are disabled, so the input is bounded instead: the answer sits at the end of
# a response, and sympy's cost grows with the expression, not with the reasoning before it.
MATH_TAIL_CHARS = 2000
MATH_TIMEOUT_S = 5


def _math_timeout() -> int | None:
    return MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` in `text` (braces matched), or None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for pos in range(begin, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            if depth == 0:
                return text[begin:pos]
            depth -= 1
    return None  # unbalanced: the response was cut off inside the box


def math_reward(response: str, label: object) -> float:
    """1.0 if the response's final answer is mathematically equal to `label`, else 0.0.

    The answer is the content of the last `\\boxed{...}`; without one, it is what math_verify
    extracts from the last MATH_TAIL_CHARS of the response ("final answer is ..." anchors, then
    the last expression). The label is read as LaTeX (wrapped in `\\boxed{}` unless it already
    has one). Equality is math_verify's symbolic/numeric check. Any parse failure or timeout,
    and any answer longer than MATH_TAIL_CHARS, scores 0.0. Safe to call from any thread:
    signal-based timeouts are used only on the main thread.
    """
    from math_verify import parse, verify  # heavy import (sympy): only when used

    timeout = _math_timeout()
    gold_text = str(label).strip()
    if not gold_text:
        return 0.0
    if "\\boxed" not in gold_text:
        gold_text = f"\\boxed{{{gold_text}}}"
    try:
        gold = parse(gold_text, parsing_timeout=timeout)
        boxed = last_boxed(response)
        if boxed is not None and len(boxed) > MATH_TAIL_CHARS:
            return 0.0
        answer_text = f"\\boxed{{{boxed}}}" if boxed is not None else response[-MATH_TAIL_CHARS:]
        answer = parse(answer_text, parsing_timeout=timeout)
        if not gold or not answer:
            return 0.0
        return 1.0 if verify(gold, answer, timeout_seconds=timeout) else 0.0
    except Exception:  # noqa: BLE001 - a reward must score, never crash the rollout
        return 0.0


def _normalize_whitespace_case(text: str) -> str:
    return " ".join(text.lower().split())


def exact_match_reward(response: str, label: object) -> float:
    """1.0 if response and label are equal after lower-casing and collapsing whitespace."""
    return float(_normalize_whitespace_case(response) == _normalize_whitespace_case(str(label)))


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def _squad_tokens(text: str) -> list[str]:
    """SQuAD normalisation: lower case, drop punctuation and articles, split on whitespace."""
    text = text.lower().translate(_PUNCTUATION)
    return _ARTICLES.sub(" ", text).split()


def f1_reward(response: str, label: object) -> float:
    """SQuAD token-overlap F1 between response and label.

        common = |tokens(response) ∩ tokens(label)| (multiset)
        P = common / |tokens(response)|,  R = common / |tokens(label)|,  F1 = 2PR / (P + R)

    If either side has no tokens, F1 is 1.0 when both are empty and 0.0 otherwise.
    """
    pred, gold = _squad_tokens(response), _squad_tokens(str(label))
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def no_reward(response: str, label: object) -> float:
    """0 for every response: training without a reward (pure on-policy distillation, where the
    teacher's reverse KL is the only signal)."""
    return 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {
    "none": no_reward,
    "math": math_reward,
    "exact": exact_match_reward,
    "f1": f1_reward,
}
