"""What the runtime knows about one engine, whoever started it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineInfo:
    """An engine the router can send requests to.

    `owned` engines were started by this run (an SGLang launch or the embedded CPU engine)
    and are restarted by their supervisor when they die; external ones (`owned=False`) are
    only health-checked and routed to, never started, restarted or killed.
    """

    url: str
    model_path: str
    tp_size: int
    weight_version: str | None
    owned: bool
