"""Which engine serves a request: a pure function of the session id, the engines' loads and
the session table (`--router-policy`).

Inputs, all owned by the router actor and passed in by value:
- ``loads``: the engines that may take a request now (healthy, not paused, on the current
  weights), each with its load = requests in flight on it (router's own plus what the engine
  reports beyond them); iteration order is registration order and makes ties deterministic;
- ``sessions``: session id -> the engine that served its last turn (where its prefix is cached);
- ``bound``: engine -> how many sessions the table binds to it (a tie-break only);
- ``cursor``: how many requests were routed so far (round-robin position, tie rotation).

Policies:
- ``sticky`` (default): a session stays on its engine, so every turn reuses the KV cache of
  the growing prefix. It moves only when its engine's load exceeds the least-loaded engine's
  by more than ``imbalance_threshold`` requests: under skew a strictly affine policy queues
  behind one hot engine while others idle. New sessions and sessions whose engine is gone
  (down, paused, removed) are placed on the least-loaded engine.
- ``consistent_hash``: rendezvous (highest-random-weight) hashing of session id over the
  available engines; ignores load. Removing an engine moves only its own sessions, and the
  hash is stable across processes (blake2b, not Python's salted ``hash``).
- ``least_loaded``: always the least-loaded engine; ignores affinity.
- ``round_robin``: engines in turn by ``cursor``; ignores affinity and load.

Requests without a session id go to the least-loaded engine under every policy except
``round_robin``, which rotates them like everything else.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass


class RoutingPolicy(str, enum.Enum):
    STICKY = "sticky"
    CONSISTENT_HASH = "consistent_hash"
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"


class Reason(str, enum.Enum):
    """Why the engine was chosen (counted per reason in the router's metrics)."""

    AFFINITY = "affinity"  # the session's engine, kept
    PLACED = "placed"  # a session seen for the first time
    REBALANCED = "rebalanced"  # sticky: moved off an engine above the imbalance threshold
    FAILOVER = "failover"  # the session's engine is not available any more
    HASH = "hash"  # consistent_hash
    LEAST_LOADED = "least_loaded"  # least_loaded policy, or a request without session
    ROUND_ROBIN = "round_robin"


@dataclass(frozen=True)
class Route:
    engine: str
    reason: Reason
    previous: str | None = None  # the engine the session was bound to before, if any

    @property
    def moved(self) -> bool:
        """The session had an engine and now uses another one (its cached prefix is lost)."""
        return self.previous is not None and self.previous != self.engine


def choose_engine(
    policy: RoutingPolicy | str,
    session_id: str | None,
    loads: Mapping[str, float],
    sessions: Mapping[str, str],
    *,
    imbalance_threshold: float = 4.0,
    bound: Mapping[str, int] | None = None,
    cursor: int = 0,
) -> Route:
    """The engine for one request; see the module docstring for the rules."""
    if not loads:
        raise ValueError("choose_engine: no engine is available")
    if imbalance_threshold < 0:
        raise ValueError(f"imbalance_threshold must be >= 0, got {imbalance_threshold}")
    policy = RoutingPolicy(policy)
    previous = sessions.get(session_id) if session_id is not None else None

    if policy is RoutingPolicy.ROUND_ROBIN:
        engines = list(loads)
        return Route(engines[cursor % len(engines)], Reason.ROUND_ROBIN, previous)
    if session_id is None or policy is RoutingPolicy.LEAST_LOADED:
        return Route(least_loaded(loads, cursor=cursor), Reason.LEAST_LOADED, previous)
    if policy is RoutingPolicy.CONSISTENT_HASH:
        return Route(rendezvous_engine(session_id, loads), Reason.HASH, previous)

    # sticky
    # Placement prefers the engine with fewest bound sessions among the least loaded, so
    # sessions that start one after another (all loads 0) still spread over the engines.
    if previous is None:
        return Route(least_loaded(loads, bound=bound, cursor=cursor), Reason.PLACED)
    if previous not in loads:
        return Route(least_loaded(loads, bound=bound, cursor=cursor), Reason.FAILOVER, previous)
    best = least_loaded(loads, bound=bound, cursor=cursor)
    if loads[previous] - loads[best] > imbalance_threshold:
        return Route(best, Reason.REBALANCED, previous)
    return Route(previous, Reason.AFFINITY, previous)


def least_loaded(loads: Mapping[str, float], *, bound: Mapping[str, int] | None = None, cursor: int = 0) -> str:
    """The engine with the lowest load, then fewest bound sessions; remaining ties rotate by
    ``cursor`` so equal engines share the work instead of the first one taking all of it."""
    if not loads:
        raise ValueError("least_loaded: no engine is available")
    bound = bound or {}
    keys = {url: (load, bound.get(url, 0)) for url, load in loads.items()}
    best = min(keys.values())
    ties = [url for url, key in keys.items() if key == best]
    return ties[cursor % len(ties)]


def rendezvous_engine(session_id: str, engines: Mapping[str, object] | list[str]) -> str:
    """Highest-random-weight hash: the engine whose hash with ``session_id`` is largest."""
    if not engines:
        raise ValueError("rendezvous_engine: no engine is available")
    return max(engines, key=lambda url: _score(session_id, url))


def _score(session_id: str, url: str) -> int:
    digest = hashlib.blake2b(f"{session_id}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
