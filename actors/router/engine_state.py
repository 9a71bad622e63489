"""What the router knows about one engine: health, pause, load, and its counters."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from slime_async.engine_client import EngineClient


class Health(str, enum.Enum):
    UP = "up"
    DOWN = "down"  # failed health checks or a connection error; re-checked, rejoins when healthy
    STALE = "stale"  # healthy but serving other weights than the router expects; rejoins on match


@dataclass
class EngineState:
    url: str
    client: EngineClient = field(repr=False)
    health: Health = Health.UP
    # Paused by a weight sync: nothing at all is sent to it (no request, health check or load
    # poll) until resume() confirms its weight version.
    paused: bool = False
    in_flight: int = 0  # requests the router has sent and not yet seen answered
    calls: set[asyncio.Task] = field(default_factory=set, repr=False)  # their HTTP calls
    external_load: float = 0.0  # running + waiting the engine reported beyond our own in-flight
    health_failures: int = 0  # consecutive
    loads_supported: bool = True  # False once /v1/loads answered 404
    weight_version: str | None = None  # last one seen (response or version check)
    down_reason: str = ""
    # cumulative counters (metrics)
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def routable(self) -> bool:
        return self.health is Health.UP and not self.paused

    @property
    def load(self) -> float:
        return self.in_flight + self.external_load

    @property
    def state(self) -> str:
        """One word for humans: up, down, stale, or paused (a pause hides health)."""
        return "paused" if self.paused else self.health.value

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "state": self.state,
            "health": self.health.value,
            "paused": self.paused,
            "in_flight": self.in_flight,
            "load": self.load,
            "weight_version": self.weight_version,
            "requests": self.requests,
            "errors": self.errors,
            "down_reason": self.down_reason,
        }


def reported_load(payload: Any) -> float:
    """Running + waiting requests from a `/v1/loads` answer.

    SGLang answers ``{"loads": [{"num_running_reqs": r, "num_waiting_reqs": w, ...}, ...]}``
    with one entry per data-parallel rank; a flat object with the same keys (one rank) is
    accepted too. Raises ValueError on any other shape, naming the keys it saw.
    """
    entries = payload.get("loads", [payload]) if isinstance(payload, dict) else payload
    if not isinstance(entries, list):
        raise ValueError(f"/v1/loads: expected a list of loads, got {type(entries).__name__}")
    total = 0.0
    for entry in entries:
        if not isinstance(entry, dict) or not ({"num_running_reqs", "num_waiting_reqs"} & entry.keys()):
            keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise ValueError(f"/v1/loads: entry without num_running_reqs/num_waiting_reqs: {keys}")
        total += float(entry.get("num_running_reqs", 0)) + float(entry.get("num_waiting_reqs", 0))
    return total
