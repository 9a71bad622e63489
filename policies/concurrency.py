"""How many generations the rollout keeps in flight: enough to fill every engine.

An engine runs at most ``max_running_requests`` sequences at once and holds at most
``max_total_num_tokens`` tokens of KV; a request may grow to its prompt plus
``--rollout-max-response-len`` tokens, which is what the engines reserve for it (the CPU engine
exactly, SGLang with a ratio that starts there). So one engine takes

    min(max_running_requests, max_total_num_tokens // tokens_per_request)

requests at once, at least 1. The rollout keeps ``OVERSUBSCRIPTION`` times that in flight per
engine, summed over the engines it can send to, capped by an explicit ``--rollout-concurrency``.
Why more than the engines hold: a group keeps its slots until all its samples are generated and
scored, so at exactly the engines' slots every group's tail (its last samples, then its reward)
leaves slots idle; the extra requests wait in the engine's queue and start the moment a
sequence finishes. Fewer starves the engines (their batch is what makes them fast).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# An engine that reports neither limit (an external server of another kind) counts as this
# many slots: the rollout's fixed concurrency before it followed the engines.
UNKNOWN_ENGINE_SLOTS = 64
# Generations in flight per slot an engine reports (see the module docstring). An engine of
# unknown size counts UNKNOWN_ENGINE_SLOTS in flight, not oversubscribed: that was the old total.
OVERSUBSCRIPTION = 2


@dataclass(frozen=True)
class EngineCapacity:
    """What one engine can hold at once; None: it does not say."""

    max_running_requests: int | None = None
    max_total_num_tokens: int | None = None


def engine_slots(capacity: EngineCapacity | None, tokens_per_request: int) -> int:
    """Requests one engine runs at once: min(running limit, KV tokens // tokens per request), >= 1."""
    if tokens_per_request <= 0:
        raise ValueError(f"tokens_per_request must be > 0, got {tokens_per_request}")
    if capacity is None:
        return UNKNOWN_ENGINE_SLOTS
    limits = []
    if capacity.max_running_requests is not None:
        limits.append(capacity.max_running_requests)
    if capacity.max_total_num_tokens is not None:
        limits.append(capacity.max_total_num_tokens // tokens_per_request)
    return max(1, min(limits)) if limits else UNKNOWN_ENGINE_SLOTS


def engine_in_flight(capacity: EngineCapacity | None, tokens_per_request: int) -> int:
    """Generations to keep in flight on one engine: OVERSUBSCRIPTION x its slots if it reports a
    limit, UNKNOWN_ENGINE_SLOTS if it reports none."""
    slots = engine_slots(capacity, tokens_per_request)
    known = capacity is not None and (capacity.max_running_requests is not None
                                      or capacity.max_total_num_tokens is not None)
    return OVERSUBSCRIPTION * slots if known else slots


def rollout_concurrency(capacities: Iterable[EngineCapacity | None], tokens_per_request: int,
                        cap: int | None = None) -> int:
    """Generations to keep in flight: OVERSUBSCRIPTION x each engine's slots (UNKNOWN_ENGINE_SLOTS
    for one that reports neither limit), summed, at most ``cap``, at least 1.

    No engine at all (every one down) gives 1 when uncapped: requests then wait in the router
    anyway, and the limit grows again as soon as one is back."""
    total = sum(engine_in_flight(c, tokens_per_request) for c in capacities)
    if cap is not None:
        total = min(total, cap)
    return max(1, total)


def group_slots(concurrency: int, samples_per_group: int) -> int:
    """Groups to keep in flight so that their samples fill ``concurrency``: ceil(c / n), >= 1."""
    if samples_per_group <= 0:
        raise ValueError(f"samples_per_group must be > 0, got {samples_per_group}")
    return max(1, -(-concurrency // samples_per_group))
