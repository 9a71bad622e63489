"""``slime.rollout.filter_hub.base_types.DynamicFilterOutput``: a dynamic filter's verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None  # counted as rollout/dynamic_filter/drop_<reason> when dropped
    # slime keeps such a group when dropping it would leave the batch short. Admission here
    # over-samples ahead instead (--over-sampling-batch-size), so it is accepted and ignored.
    keep_when_insufficient: bool = False


def as_filter_output(value: Any) -> DynamicFilterOutput:
    """A filter's return value as DynamicFilterOutput (slime's legacy filters return a bool)."""
    if isinstance(value, DynamicFilterOutput):
        return value
    return DynamicFilterOutput(keep=bool(value))
