"""Routing policies as pure functions: stickiness, migration at the threshold, failover,
determinism of the hash."""

import subprocess
import sys

import pytest

from policies.routing import Reason, RoutingPolicy, choose_engine, least_loaded, rendezvous_engine

A, B, C = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"


def route(policy, session, loads, sessions=None, **kwargs):
    return choose_engine(policy, session, loads, sessions or {}, **kwargs)


# ----- sticky -------------------------------------------------------------------------------
def test_sticky_keeps_a_session_on_its_engine_although_another_is_less_loaded():
    chosen = route("sticky", "s", {A: 3, B: 0, C: 1}, {"s": A}, imbalance_threshold=4)
    assert chosen.engine == A
    assert chosen.reason is Reason.AFFINITY
    assert not chosen.moved


def test_sticky_places_a_new_session_on_the_least_loaded_engine():
    chosen = route("sticky", "new", {A: 2, B: 1, C: 3}, {"other": A})
    assert (chosen.engine, chosen.reason, chosen.previous) == (B, Reason.PLACED, None)


def test_sticky_spreads_new_sessions_by_bound_count_when_loads_are_equal():
    chosen = route("sticky", "new", {A: 0, B: 0, C: 0}, bound={A: 2, B: 1, C: 2})
    assert chosen.engine == B


def test_sticky_stays_when_the_imbalance_equals_the_threshold():
    # A − B = 4 − 0 = 4, not more than the threshold 4
    chosen = route("sticky", "s", {A: 4, B: 0}, {"s": A}, imbalance_threshold=4)
    assert chosen.engine == A and not chosen.moved


def test_sticky_moves_when_the_imbalance_exceeds_the_threshold():
    # A − B = 5 − 0 = 5 > 4: move to the least-loaded engine
    chosen = route("sticky", "s", {A: 5, B: 0, C: 2}, {"s": A}, imbalance_threshold=4)
    assert (chosen.engine, chosen.reason, chosen.previous) == (B, Reason.REBALANCED, A)
    assert chosen.moved


def test_sticky_with_threshold_zero_moves_on_any_imbalance():
    chosen = route("sticky", "s", {A: 1, B: 0}, {"s": A}, imbalance_threshold=0)
    assert chosen.engine == B


def test_sticky_fails_a_session_over_when_its_engine_is_not_available():
    # A is down: it is absent from the available engines
    chosen = route("sticky", "s", {B: 2, C: 1}, {"s": A})
    assert (chosen.engine, chosen.reason, chosen.previous) == (C, Reason.FAILOVER, A)
    assert chosen.moved


def test_a_request_without_session_goes_to_the_least_loaded_engine():
    for policy in ("sticky", "consistent_hash", "least_loaded"):
        assert route(policy, None, {A: 2, B: 1, C: 3}).engine == B


# ----- consistent_hash -------------------------------------------------------------------------
def test_consistent_hash_is_deterministic_and_ignores_load():
    engines = {A: 0, B: 0, C: 0}
    first = route("consistent_hash", "session-42", engines).engine
    assert route("consistent_hash", "session-42", {A: 100, B: 100, C: 100} | {first: 1000}).engine == first
    assert route("consistent_hash", "session-42", dict(reversed(list(engines.items())))).engine == first


def test_consistent_hash_is_the_same_in_another_process():
    # Python's hash() is salted per process; the routing hash must not be.
    here = [rendezvous_engine(f"s{i}", [A, B, C]) for i in range(20)]
    code = (
        "from policies.routing import rendezvous_engine; "
        f"print([rendezvous_engine(f's{{i}}', {[A, B, C]!r}) for i in range(20)])"
    )
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == repr(here)


def test_consistent_hash_spreads_sessions_over_all_engines():
    counts = {A: 0, B: 0, C: 0}
    for i in range(300):
        counts[rendezvous_engine(f"session-{i}", list(counts))] += 1
    assert all(count > 60 for count in counts.values()), counts


def test_consistent_hash_moves_only_the_sessions_of_a_removed_engine():
    sessions = [f"session-{i}" for i in range(200)]
    before = {s: rendezvous_engine(s, [A, B, C]) for s in sessions}
    after = {s: rendezvous_engine(s, [A, C]) for s in sessions}
    moved = {s for s in sessions if before[s] != after[s]}
    assert moved == {s for s in sessions if before[s] == B}
    assert moved  # B had some sessions


def test_consistent_hash_reports_a_move_when_the_table_disagrees():
    engine = rendezvous_engine("s", [A, B])
    other = B if engine == A else A
    chosen = route("consistent_hash", "s", {A: 0, B: 0}, {"s": other})
    assert chosen.engine == engine and chosen.moved


# ----- least_loaded / round_robin --------------------------------------------------------------
def test_least_loaded_ignores_the_session_engine():
    chosen = route("least_loaded", "s", {A: 1, B: 0}, {"s": A}, imbalance_threshold=100)
    assert chosen.engine == B and chosen.moved


def test_least_loaded_rotates_ties_by_cursor():
    loads = {A: 1, B: 0, C: 0}
    assert [least_loaded(loads, cursor=i) for i in range(4)] == [B, C, B, C]


def test_round_robin_cycles_through_engines_in_order():
    loads = {A: 9, B: 0, C: 0}
    assert [route("round_robin", "s", loads, cursor=i).engine for i in range(4)] == [A, B, C, A]


# ----- errors ---------------------------------------------------------------------------------------
def test_no_available_engine_is_an_error():
    with pytest.raises(ValueError, match="no engine"):
        route("sticky", "s", {})


def test_an_unknown_policy_is_an_error():
    with pytest.raises(ValueError, match="random"):
        route("random", "s", {A: 0})


def test_policy_names_match_the_flag_values():
    assert [p.value for p in RoutingPolicy] == ["sticky", "consistent_hash", "least_loaded", "round_robin"]
