"""DAPO's rule-based math score (the one slime's retool example imports from
``rm_hub.math_dapo_utils``): +1 for a correct final answer, -1 otherwise, with the prediction.

Only the end of a solution is read (``TAIL_CHARS``): the answer is written last, and a long
reasoning trace must not match an earlier guess.

- ``strict_box_verify``: the prediction is the content of the last ``\\boxed{...}``; it must equal
  the ground truth exactly (surrounding whitespace aside).
- otherwise: the prediction follows the last ``Answer:``; both sides are normalised (dollar
  signs, ``\\boxed{}`` / ``\\text{}`` wrappers, spaces, a trailing period, thousands commas) and
  must be equal.
"""

from __future__ import annotations

import re
from typing import Any

from policies.rewards import last_boxed

TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_TEXT = re.compile(r"\\text\{(.*?)\}")


def normalize_final_answer(answer: str) -> str:
    """A final answer with its formatting removed (``$\\boxed{1,000}.$`` -> ``1000``)."""
    text = answer.strip()
    boxed = last_boxed(text)
    if boxed is not None:
        text = boxed
    text = _TEXT.sub(r"\1", text).replace("$", "").replace(" ", "")
    text = text.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    return text


def dapo_score(solution: str, ground_truth: Any, *, strict_box_verify: bool = False) -> dict[str, Any]:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}`` for ``solution`` against ``ground_truth``."""
    tail = solution[-TAIL_CHARS:]
    truth = str(ground_truth)
    if strict_box_verify:
        pred = last_boxed(tail)
        correct = pred is not None and pred.strip() == truth.strip()
    else:
        matches = _ANSWER.findall(tail)
        pred = normalize_final_answer(matches[-1]) if matches else None
        correct = pred is not None and pred == normalize_final_answer(truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
