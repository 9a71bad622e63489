"""``slime.rollout.rm_hub.math_dapo_utils.compute_score`` (slime's retool example imports it).

The one place the compat package reaches into ``policies``: the rule itself is RL math and lives
there (``policies.dapo_score``); this module only gives it slime's import path and signature.
"""

from __future__ import annotations

from typing import Any


def compute_score(solution_str: str, ground_truth: Any, strict_box_verify: bool = False,
                  pause_tokens_index: Any = None) -> dict[str, Any]:
    """``{"score": 1.0 | -1.0, "acc": bool, "pred": str | None}``; ``pause_tokens_index`` is accepted and unused."""
    from policies.dapo_score import dapo_score  # the rule lives with the other reward functions

    return dapo_score(solution_str, ground_truth, strict_box_verify=strict_box_verify)
