"""The ideal episode of a reverse_digits row (the warm start's target; not part of the env)."""

from __future__ import annotations

from typing import Any


def episode(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": row["answer"]}]
