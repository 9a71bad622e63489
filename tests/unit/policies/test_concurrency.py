"""The rollout's concurrency from what the engines hold at once (policies.concurrency), and how
the router reads that from an engine's /server_info (SGLang 0.5.17's and the CPU engine's)."""

import pytest

from actors.router.engine_state import reported_capacity
from policies.concurrency import (
    OVERSUBSCRIPTION,
    UNKNOWN_ENGINE_SLOTS,
    EngineCapacity,
    engine_in_flight,
    engine_slots,
    group_slots,
    rollout_concurrency,
)


def test_an_engine_takes_the_smaller_of_its_running_limit_and_its_kv_tokens_per_request():
    # 1000 KV tokens // 128 per request = 7 < 32 running; 100000 // 128 = 781 > 32.
    assert engine_slots(EngineCapacity(32, 1000), 128) == 7
    assert engine_slots(EngineCapacity(32, 100_000), 128) == 32


def test_an_engine_that_cannot_hold_one_whole_request_still_takes_one():
    assert engine_slots(EngineCapacity(8, 100), 128) == 1


def test_an_engine_that_reports_one_limit_is_held_to_it_and_one_that_reports_none_counts_the_old_default():
    assert engine_slots(EngineCapacity(max_running_requests=5), 128) == 5
    assert engine_slots(EngineCapacity(max_total_num_tokens=640), 128) == 5
    assert engine_slots(EngineCapacity(), 128) == UNKNOWN_ENGINE_SLOTS == 64
    assert engine_slots(None, 128) == 64


def test_an_engine_that_reports_a_limit_gets_twice_its_slots_in_flight_and_an_unknown_one_the_old_64():
    assert OVERSUBSCRIPTION == 2
    assert engine_in_flight(EngineCapacity(32, 1000), 128) == 14  # 2 x 7
    assert engine_in_flight(EngineCapacity(max_running_requests=5), 128) == 10
    assert engine_in_flight(EngineCapacity(), 128) == 64
    assert engine_in_flight(None, 128) == 64


def test_the_concurrency_is_twice_the_known_engines_slots_summed_and_capped():
    engines = [EngineCapacity(32, 1000), EngineCapacity(32, 100_000), None]  # 2 x 7 + 2 x 32 + 64
    assert rollout_concurrency(engines, 128) == 142
    assert rollout_concurrency(engines, 128, cap=50) == 50
    assert rollout_concurrency(engines, 128, cap=500) == 142


def test_the_quick_starts_cpu_engine_gets_64_in_flight_eight_groups_of_eight():
    # The CPU engine's defaults: 32 running, 65536 KV tokens; a request of ~40 prompt + 8 new tokens.
    limit = rollout_concurrency([EngineCapacity(32, 65536)], 48)
    assert limit == 64
    assert group_slots(limit, 8) == 8


def test_with_no_engine_the_concurrency_is_one():
    assert rollout_concurrency([], 128) == 1


def test_group_slots_cover_the_concurrency_rounding_up():
    assert group_slots(512, 8) == 64
    assert group_slots(10, 4) == 3  # 12 samples' room: the last group's 2 extra wait for slots
    assert group_slots(3, 8) == 1


@pytest.mark.parametrize("bad", [0, -1])
def test_a_request_of_no_tokens_is_refused(bad):
    with pytest.raises(ValueError, match="tokens_per_request"):
        engine_slots(EngineCapacity(1, 1), bad)


def test_sglang_server_info_gives_the_resolved_running_limit_of_each_dp_rank_and_the_kv_pool():
    # SGLang 0.5.17 /server_info: server args (max_running_requests None = left to SGLang), the
    # scheduler's max_total_num_tokens, and per DP rank the limit it resolved.
    info = {"max_running_requests": None, "max_total_num_tokens": 1_200_000, "dp_size": 1,
            "internal_states": [{"effective_max_running_requests_per_dp": 2048, "last_gen_throughput": 0.0}]}
    assert reported_capacity(info) == EngineCapacity(2048, 1_200_000)


def test_two_dp_ranks_hold_twice_the_requests_and_tokens():
    info = {"max_total_num_tokens": 1000, "internal_states": [
        {"effective_max_running_requests_per_dp": 8}, {"effective_max_running_requests_per_dp": 8}]}
    assert reported_capacity(info) == EngineCapacity(16, 2000)


def test_the_cpu_engines_top_level_fields_and_a_server_that_reports_nothing():
    assert reported_capacity({"max_running_requests": 4, "max_total_num_tokens": 250,
                              "internal_states": [{"num_prefills": 0}]}) == EngineCapacity(4, 250)
    assert reported_capacity({"version": "x"}) == EngineCapacity(None, None)
