"""What the router knows about one engine: health, pause, load, and its counters."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from policies.concurrency import EngineCapacity
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
    # In-place syncs (pause mode in_place): the engine itself holds its running requests. A
    # request that ran across one (the count moved while it ran) has its tokens labelled with
    # the version before the first such pause when the engine cannot say which tokens came
    # before it (SGLang's plain answer; a streamed one says): the version seen when it was sent,
    # else the last pause's.
    # paused_in_place stays True until continue_generation succeeded (the health loop retries it).
    paused_in_place: bool = False
    in_place_pauses: int = 0
    last_in_place_pause_version: str | None = None
    # What it can hold at once (/server_info), read when it is admitted: None until then.
    capacity: EngineCapacity | None = None
    # Streamed requests (--router-stream-generate): how many tokens sampled before an in-place
    # pause its stream may report after the update (/server_info, reported_version_lag).
    version_lag: int = 0
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


def reported_capacity(server_info: Any) -> EngineCapacity:
    """What an engine can hold at once, from its ``/server_info``.

    SGLang 0.5.17 puts ``max_total_num_tokens`` (its KV pool) at the top level (the scheduler's
    info) and the running-request limit it resolved in each DP rank's ``internal_states``
    entry as ``effective_max_running_requests_per_dp`` (the top-level ``max_running_requests``
    is the server argument, None when left to SGLang); the CPU engine reports both at the top
    level. A field it does not report is None (no limit known)."""
    if not isinstance(server_info, dict):
        raise ValueError(f"/server_info: expected an object, got {type(server_info).__name__}")
    states = [s for s in server_info.get("internal_states") or [] if isinstance(s, dict)]
    per_rank = [s.get("effective_max_running_requests_per_dp") for s in states]
    if per_rank and all(isinstance(v, int) and v > 0 for v in per_rank):
        running: int | None = sum(per_rank)
    else:
        running = _positive_int(server_info.get("max_running_requests"))
    tokens = _positive_int(server_info.get("max_total_num_tokens"))
    if tokens is not None and len(states) > 1:
        tokens *= len(states)  # one KV pool per DP rank
    return EngineCapacity(max_running_requests=running, max_total_num_tokens=tokens)


def reported_version_lag(server_info: Any) -> int:
    """How many output tokens sampled before an in-place pause an engine's stream may report only
    after the update, under the new weight version, from its ``/server_info`` (SGLang's server
    args): the overlap scheduler holds its last step's result through the pause (scheduler.py
    ``event_loop_overlap``; with speculative decoding that step may bring every draft token), and
    ``stream_interval`` N streams a request only every N tokens. 0 when the engine says neither
    (the CPU engine reports stream_interval 1, no overlap)."""
    if not isinstance(server_info, dict):
        return 0
    interval = server_info.get("stream_interval")
    lag = interval - 1 if isinstance(interval, int) and interval > 1 else 0
    if server_info.get("disable_overlap_schedule") is False:
        drafts = server_info.get("speculative_num_draft_tokens")
        speculative = server_info.get("speculative_algorithm") not in (None, "", "NONE")
        lag += drafts if speculative and isinstance(drafts, int) and drafts > 1 else 1
    return lag


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


def engine_tag(url: str) -> str:
    """``http://127.0.0.1:30001`` -> ``127.0.0.1:30001`` for metric names."""
    return url.split("://", 1)[-1]
