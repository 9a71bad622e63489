"""What SGLang's ``/generate`` accepts in a batch request, for every server of it here (the CPU
engine, the router's native front)."""

from __future__ import annotations

from typing import Any


def per_request(value: Any, n: int, name: str, kind: type, error: type[Exception] = ValueError) -> list[Any]:
    """A batch field as one value per request: SGLang takes one value for all of them, or a list
    with one per request (``kind`` list: the value itself is a list, never split). A wrong count or
    type raises ``error`` naming the field."""
    if isinstance(value, list) and kind is not list:
        if len(value) != n:
            raise error(f"{name} has {len(value)} entries for a batch of {n}")
        return value
    if value is not None and not isinstance(value, kind):
        raise error(f"{name} must be {kind.__name__} or a list of them, got {value!r}")
    return [value] * n
