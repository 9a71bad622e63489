"""``slime.rollout.base_types``: the outputs of slime's rollout functions (importable; see below).

slime's ``--rollout-function-path generate_rollout(args, rollout_id, data_source, evaluation)``
is refused here (the rollout actor owns data, admission and checkpoints); these types exist so
a module that defines one still imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slime_async.sample import Sample


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None
