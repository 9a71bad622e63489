"""BufferActor: backpressure, staleness admission, stale drops, FIFO, stragglers, end of data,
checkpoint round-trip, and simulations of uneven and long-tail generation."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from actors.buffer import BufferActor, BufferConfig
from slime_async.actor import spawn
from slime_async.sample import Sample, Status


def make_group(group_index: int, *versions: int, n_samples: int = 2) -> list[Sample]:
    """``n_samples`` samples whose response has one generated token per entry of ``versions``."""
    versions = versions or (0,)
    group = []
    for i in range(n_samples):
        sample = Sample(group_index=group_index, index=i, prompt="p", tokens=[1, 2])
        for v in versions:
            sample.append_generated([7], [-0.5], version=v)
        sample.status = Status.COMPLETED
        group.append(sample)
    return group


async def settle(rounds: int = 50) -> None:
    """Let every ready task and mailbox run until nothing more can happen without new input."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@pytest.fixture
async def start_buffer():
    refs = []

    async def start(capacity: int = 8, max_staleness: int | None = None, groups_per_step: int = 1,
                    mask_offpolicy: bool = False, straggler_policy: str = "wait", **kwargs):
        config = BufferConfig(buffer_capacity=capacity, max_staleness=max_staleness,
                              mask_offpolicy_in_partial_rollout=mask_offpolicy, straggler_policy=straggler_policy)
        ref = await spawn(BufferActor(config, groups_per_step=groups_per_step, **kwargs))
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        await ref.stop()


def ask_later(ref, method: str, *args):
    return asyncio.ensure_future(ref.ask(method, *args, timeout=None))


def indices(groups: list[list[Sample]]) -> list[int]:
    return [g[0].group_index for g in groups]


# ----- backpressure ------------------------------------------------------------------------------
async def test_put_beyond_capacity_waits_until_a_get_makes_room(start_buffer):
    buffer = await start_buffer(capacity=2)
    await buffer.ask("put", make_group(0))
    await buffer.ask("put", make_group(1))
    third = ask_later(buffer, "put", make_group(2))
    await settle()
    assert not third.done()
    assert (await buffer.ask("metrics"))["buffer/waiting_puts"] == 1

    assert indices(await buffer.ask("get", 1, 0)) == [0]
    await third
    assert (await buffer.ask("metrics"))["buffer/size"] == 2


async def test_reservations_count_against_capacity(start_buffer):
    buffer = await start_buffer(capacity=2)
    await buffer.ask("reserve")
    await buffer.ask("reserve")
    third = ask_later(buffer, "reserve")
    await settle()
    assert not third.done()

    await buffer.ask("put", make_group(0))
    await buffer.ask("get", 1, 0)
    await third
    assert (await buffer.ask("metrics"))["buffer/reserved"] == 2


async def test_put_turns_a_reservation_into_a_buffered_group(start_buffer):
    buffer = await start_buffer()
    await buffer.ask("reserve")
    await buffer.ask("put", make_group(0))
    metrics = await buffer.ask("metrics")
    assert (metrics["buffer/reserved"], metrics["buffer/size"]) == (0, 1)


async def test_cancelled_reservation_frees_its_slot(start_buffer):
    buffer = await start_buffer(capacity=1)
    await buffer.ask("reserve")
    waiting = ask_later(buffer, "reserve")
    await settle()
    assert not waiting.done()
    await buffer.ask("cancel_reservation")
    await waiting


async def test_cancel_without_reservation_is_an_error(start_buffer):
    buffer = await start_buffer()
    with pytest.raises(ValueError, match="without an outstanding reservation"):
        await buffer.ask("cancel_reservation")


# ----- admission ---------------------------------------------------------------------------------
async def test_admission_stops_at_the_staleness_bound(start_buffer):
    # k = 1, G = 2: at version 0 at most (0 + 1 + 1) * 2 = 4 groups may exist.
    buffer = await start_buffer(capacity=16, max_staleness=1, groups_per_step=2)
    for _ in range(4):
        await buffer.ask("reserve")
    fifth = ask_later(buffer, "reserve")
    await settle()
    assert not fifth.done()
    assert (await buffer.ask("metrics"))["buffer/waiting_reservations"] == 1


async def test_admission_resumes_after_set_version(start_buffer):
    buffer = await start_buffer(capacity=16, max_staleness=1, groups_per_step=2)
    for _ in range(4):
        await buffer.ask("reserve")
    waiting = [ask_later(buffer, "reserve") for _ in range(3)]
    await settle()
    await buffer.ask("set_version", 1)  # limit becomes (1 + 1 + 1) * 2 = 6: two more
    await settle()
    assert [w.done() for w in waiting] == [True, True, False]


async def test_consumed_groups_count_toward_the_bound(start_buffer):
    # Sync (k = 0, G = 1): one group per version, whether it is pending or already trained.
    buffer = await start_buffer(max_staleness=0, groups_per_step=1)
    await buffer.ask("reserve")
    await buffer.ask("put", make_group(0))
    await buffer.ask("get", 1, 0)
    second = ask_later(buffer, "reserve")
    await settle()
    assert not second.done()
    await buffer.ask("set_version", 1)
    await second


async def test_unbounded_staleness_admits_up_to_capacity(start_buffer):
    buffer = await start_buffer(capacity=5, max_staleness=None, groups_per_step=1)
    for _ in range(5):
        await buffer.ask("reserve")
    sixth = ask_later(buffer, "reserve")
    await settle()
    assert not sixth.done()


async def test_version_cannot_go_back(start_buffer):
    buffer = await start_buffer(version=3)
    with pytest.raises(ValueError, match="from 3 to 2"):
        await buffer.ask("set_version", 2)


# ----- get, FIFO, stale drops ----------------------------------------------------------------------
async def test_get_returns_groups_in_fifo_order(start_buffer):
    buffer = await start_buffer()
    for i in range(5):
        await buffer.ask("put", make_group(i))
    assert indices(await buffer.ask("get", 2, 0)) == [0, 1]
    assert indices(await buffer.ask("get", 3, 0)) == [2, 3, 4]


async def test_get_waits_until_enough_groups_arrive(start_buffer):
    buffer = await start_buffer()
    get = ask_later(buffer, "get", 2, 0)
    await buffer.ask("put", make_group(0))
    await settle()
    assert not get.done()
    await buffer.ask("put", make_group(1))
    assert indices(await get) == [0, 1]
    assert (await buffer.ask("metrics"))["buffer/consumed_groups"] == 2


async def test_get_larger_than_capacity_is_refused(start_buffer):
    buffer = await start_buffer(capacity=4)
    with pytest.raises(ValueError, match="5 groups from a buffer of capacity 4"):
        await buffer.ask("get", 5, 0)


async def test_stale_groups_are_dropped_and_counted_at_get(start_buffer):
    buffer = await start_buffer(max_staleness=1)
    await buffer.ask("put", make_group(0, 0, n_samples=3))  # oldest token v0: 2 stale at v2
    await buffer.ask("put", make_group(1, 1))
    await buffer.ask("put", make_group(2, 0, 2))  # a partial rollout: its oldest token decides
    await buffer.ask("put", make_group(3, 2))
    assert indices(await buffer.ask("get", 2, 2)) == [1, 3]
    metrics = await buffer.ask("metrics")
    assert (metrics["buffer/dropped_stale"], metrics["buffer/dropped_stale_samples"]) == (2, 5)
    assert metrics["buffer/staleness_max"] == 1


async def test_groups_made_stale_by_a_version_bump_are_dropped(start_buffer, caplog):
    buffer = await start_buffer(max_staleness=0)
    await buffer.ask("put", make_group(0, 0))
    await buffer.ask("set_version", 1)
    metrics = await buffer.ask("metrics")
    assert (metrics["buffer/size"], metrics["buffer/dropped_stale"]) == (0, 1)
    # At a bound of 0 (sync) a drop is never routine: it is said on the console, not only counted.
    assert [r.levelname for r in caplog.records if "dropped as too stale" in r.message] == ["WARNING"]


async def test_mask_offpolicy_keeps_a_group_with_fresh_tokens(start_buffer):
    buffer = await start_buffer(max_staleness=1, mask_offpolicy=True)
    await buffer.ask("put", make_group(0, 0, 2))  # old v0 tokens masked later, v2 tokens trainable
    await buffer.ask("put", make_group(1, 0))  # nothing trainable left at v2
    await buffer.ask("put", make_group(2, 2))
    assert indices(await buffer.ask("get", 2, 2)) == [0, 2]
    assert (await buffer.ask("metrics"))["buffer/dropped_stale"] == 1


async def test_group_without_generated_tokens_is_never_stale(start_buffer):
    buffer = await start_buffer(max_staleness=0)
    empty = [Sample(group_index=0, index=0, prompt="p", tokens=[1, 2], status=Status.FAILED)]
    await buffer.ask("put", empty)
    assert indices(await buffer.ask("get", 1, 5)) == [0]


async def test_masked_out_samples_are_counted_when_their_group_is_trained(start_buffer):
    buffer = await start_buffer(max_staleness=1, mask_offpolicy=True)
    group = make_group(0, 0, 2)  # both samples: a v0 token (masked at v2) and a v2 token
    group[1].token_versions = [0, 0]  # this one has only v0 tokens: nothing left to train at v2
    await buffer.ask("put", group)
    assert indices(await buffer.ask("get", 1, 2)) == [0]
    metrics = await buffer.ask("metrics")
    assert (metrics["buffer/dropped_stale"], metrics["buffer/masked_out_samples"]) == (0, 1)


# ----- stragglers (--straggler-policy) ---------------------------------------------------------------
async def test_reserve_answers_with_the_admission_version(start_buffer):
    buffer = await start_buffer(max_staleness=1, version=3)
    assert await buffer.ask("reserve") == 3


async def straggler_setup(buffer) -> asyncio.Future:
    """k = 1, G = 1: group 0 admitted at v0 (due at 1) is still generating; group 1, admitted at
    v1, finished first. A step at version 1 is group 0's last chance: its get, asked now."""
    assert await buffer.ask("reserve") == 0
    await buffer.ask("set_version", 1)
    assert await buffer.ask("reserve") == 1
    await buffer.ask("put", make_group(1, 1), admitted=1)
    get = ask_later(buffer, "get", 1, 1)
    await settle()
    return get


async def test_a_step_waits_for_the_straggler_whose_deadline_it_is(start_buffer):
    buffer = await start_buffer(max_staleness=1, groups_per_step=1)
    get = await straggler_setup(buffer)
    assert not get.done()
    assert (await buffer.ask("metrics"))["buffer/straggler_holds"] == 1
    await buffer.ask("put", make_group(0, 0), admitted=0)
    assert indices(await get) == [0]
    assert (await buffer.ask("metrics"))["buffer/dropped_stale"] == 0


async def test_with_straggler_policy_drop_the_step_goes_ahead_and_the_straggler_is_dropped(start_buffer):
    buffer = await start_buffer(max_staleness=1, groups_per_step=1, straggler_policy="drop")
    get = await straggler_setup(buffer)
    assert indices(await get) == [1]
    await buffer.ask("set_version", 2)
    await buffer.ask("put", make_group(0, 0), admitted=0)
    assert (await buffer.ask("metrics"))["buffer/dropped_stale"] == 1


async def test_a_cancelled_straggler_releases_the_step_it_held(start_buffer):
    buffer = await start_buffer(max_staleness=1, groups_per_step=1)
    get = await straggler_setup(buffer)
    await buffer.ask("cancel_reservation", admitted=0)
    assert indices(await get) == [1]


async def test_a_put_without_its_admission_version_retires_the_oldest_reservation(start_buffer):
    # Group 1 comes back without saying it was admitted at v1: the v0 reservation is retired, the
    # buffer no longer knows of a straggler due at 1, and the step goes ahead (the old behaviour).
    buffer = await start_buffer(max_staleness=1, groups_per_step=1)
    await buffer.ask("reserve")
    await buffer.ask("set_version", 1)
    await buffer.ask("reserve")
    await buffer.ask("put", make_group(1, 1))
    assert indices(await buffer.ask("get", 1, 1)) == [1]


async def test_a_step_is_not_held_for_a_group_that_waits_for_room(start_buffer):
    # A full buffer (two groups due at 2) and a put waiting for space (due at 1): it can only enter
    # after a get, so holding the get for it would wait forever.
    buffer = await start_buffer(capacity=2, max_staleness=1, groups_per_step=1, version=1)
    await buffer.ask("put", make_group(0, 1))
    await buffer.ask("put", make_group(1, 1))
    late = ask_later(buffer, "put", make_group(2, 0))
    await settle()
    assert indices(await buffer.ask("get", 1, 1)) == [0]
    await late
    assert (await buffer.ask("metrics"))["buffer/size"] == 2


def test_waiting_for_stragglers_needs_the_oldest_first_order():
    with pytest.raises(ValueError, match="--straggler-policy wait .* --buffer-order oldest_first, got fifo"):
        BufferConfig(buffer_order="fifo").validate()
    BufferConfig(buffer_order="fifo", straggler_policy="drop").validate()


# ----- end of data ---------------------------------------------------------------------------------
async def test_a_waiting_get_is_answered_none_as_soon_as_the_data_ends(start_buffer):
    buffer = await start_buffer()
    await buffer.ask("put", make_group(0))
    get = ask_later(buffer, "get", 2, 0)
    await settle()
    assert not get.done()
    buffer.tell("end_of_data")
    await settle()  # a few turns of the event loop, no timer: nothing polls
    assert get.done() and get.result() is None


async def test_after_the_end_gets_the_groups_left_can_fill_are_still_served(start_buffer):
    buffer = await start_buffer()
    for g in range(3):
        await buffer.ask("put", make_group(g))
    await buffer.ask("end_of_data")
    assert indices(await buffer.ask("get", 2, 0)) == [0, 1]
    assert await buffer.ask("get", 2, 0) is None


async def test_the_end_waits_for_a_reserved_group(start_buffer):
    buffer = await start_buffer()
    await buffer.ask("reserve")
    await buffer.ask("end_of_data")
    get = ask_later(buffer, "get", 1, 0)
    await settle()
    assert not get.done()
    await buffer.ask("put", make_group(7))
    assert indices(await get) == [7]


async def test_put_rejects_a_group_that_is_not_samples(start_buffer):
    buffer = await start_buffer()
    with pytest.raises(TypeError, match="group item 1 is a dict"):
        await buffer.ask("put", [make_group(0)[0], {"tokens": []}])


# ----- checkpoint ----------------------------------------------------------------------------------
async def test_state_round_trip_restores_groups_and_counters(start_buffer):
    buffer = await start_buffer(max_staleness=1)
    for i, version in enumerate([0, 1, 1, 2]):
        await buffer.ask("put", make_group(i, version))
    await buffer.ask("get", 1, 2)  # drops group 0 (v0), takes group 1
    await buffer.ask("set_version", 2)
    state = json.loads(json.dumps(await buffer.ask("state_dict")))  # a checkpoint is serializable

    restored = await start_buffer(max_staleness=1)
    await restored.ask("load_state_dict", state)
    last_batch_only = "buffer/staleness_max"  # describes the last get, not the buffer's state
    expected = {k: v for k, v in (await buffer.ask("metrics")).items() if k != last_batch_only}
    assert await restored.ask("metrics") == expected
    original = await buffer.ask("get", 2, 2)
    again = await restored.ask("get", 2, 2)
    assert [[s.to_dict() for s in g] for g in again] == [[s.to_dict() for s in g] for g in original]


async def test_state_includes_groups_waiting_for_space(start_buffer):
    buffer = await start_buffer(capacity=1)
    await buffer.ask("put", make_group(0))
    ask_later(buffer, "put", make_group(1))
    await settle()
    state = await buffer.ask("state_dict")
    assert [g[0]["group_index"] for g in state["groups"]] == [0, 1]


async def test_load_state_into_a_busy_buffer_is_refused(start_buffer):
    buffer = await start_buffer()
    state = await buffer.ask("state_dict")
    await buffer.ask("reserve")
    with pytest.raises(RuntimeError, match="reservations or waiting calls"):
        await buffer.ask("load_state_dict", state)


# ----- simulation ----------------------------------------------------------------------------------
async def simulate(buffer, *, k: int, groups_per_step: int, steps: int, workers: int, max_chunks: int,
                   skip_probability: float, seed: int, chunk_yields: int = 20,
                   train_yields: tuple[int, int] = (0, 60)) -> tuple[list, int, dict[str, float]]:
    """Producers generate groups in chunks (a partial rollout stamps each chunk with the policy
    version of that moment) and drop some; a slow consumer trains G groups per step and bumps
    the version. Durations are counted in event-loop yields, so a run is deterministic.
    Returns (violations of the bound, groups put, buffer metrics)."""
    rng = random.Random(seed)
    policy = {"version": 0}
    puts = 0

    async def producer(worker: int) -> None:
        nonlocal puts
        for n in range(10_000):
            admitted = await buffer.ask("reserve", timeout=None)
            group_index = worker * 10_000 + n
            samples = [Sample(group_index=group_index, index=i, prompt="p", tokens=[1]) for i in range(2)]
            for _ in range(rng.randint(1, max_chunks)):  # chunks, resumed across weight syncs
                for sample in samples:
                    sample.append_generated([5], [-1.0], version=policy["version"])
                await settle(rng.randint(0, chunk_yields))
            if rng.random() < 0.1:  # dropped by a dynamic-sampling filter
                await buffer.ask("cancel_reservation", admitted=admitted)
                continue
            puts += 1
            await buffer.ask("put", samples, admitted=admitted, timeout=None)

    producers = [asyncio.ensure_future(producer(w)) for w in range(workers)]
    violations = []
    try:
        async with asyncio.timeout(120):  # a safety net against a deadlock, not an assertion
            for _ in range(steps):
                version = policy["version"]
                groups = await buffer.ask("get", groups_per_step, version, timeout=None)
                for group in groups:
                    oldest = min(v for s in group for v in s.token_versions)
                    if version - oldest > k:
                        violations.append((group[0].group_index, oldest, version))
                await settle(rng.randint(*train_yields))  # training
                policy["version"] += 2 if rng.random() < skip_probability else 1
                await buffer.ask("set_version", policy["version"])
    finally:
        for task in producers:
            task.cancel()
        await asyncio.gather(*producers, return_exceptions=True)
    metrics = await buffer.ask("metrics")  # answered after every put already sent (FIFO mailbox)
    return violations, puts, metrics


def accounted(metrics: dict[str, float]) -> float:
    """Every group put is trained, dropped, or still in the buffer."""
    return (metrics["buffer/consumed_groups"] + metrics["buffer/dropped_stale"]
            + metrics["buffer/size"] + metrics["buffer/waiting_puts"])


async def test_simulation_admission_alone_keeps_in_order_groups_within_the_bound(start_buffer):
    """A fast producer whose groups complete in admission order, a slow consumer, one version
    per step: admission is the whole guarantee, nothing needs dropping. (The capacity is large
    enough that without admission control the buffer would fill with too-old groups.)"""
    k, per_step, steps = 2, 3, 40
    buffer = await start_buffer(capacity=30, max_staleness=k, groups_per_step=per_step)
    violations, puts, metrics = await simulate(buffer, k=k, groups_per_step=per_step, steps=steps, workers=1,
                                               max_chunks=3, skip_probability=0.0, seed=1, chunk_yields=2,
                                               train_yields=(100, 200))
    assert violations == []
    assert metrics["buffer/consumed_groups"] == steps * per_step
    assert metrics["buffer/dropped_stale"] == 0
    assert accounted(metrics) == puts


async def test_simulation_stragglers_and_version_jumps_are_dropped_never_trained(start_buffer):
    """Concurrent groups of uneven length finish out of admission order and some steps bump the
    version twice: the admission rule's assumptions break, the excess is dropped and counted,
    and still no trained group exceeds the bound."""
    k, per_step, steps = 2, 3, 40
    buffer = await start_buffer(capacity=10, max_staleness=k, groups_per_step=per_step)
    violations, puts, metrics = await simulate(buffer, k=k, groups_per_step=per_step, steps=steps, workers=4,
                                               max_chunks=4, skip_probability=0.3, seed=1234)
    assert violations == []
    assert metrics["buffer/consumed_groups"] == steps * per_step
    assert metrics["buffer/dropped_stale"] > 0
    assert metrics["buffer/dropped_stale_samples"] == 2 * metrics["buffer/dropped_stale"]
    assert accounted(metrics) == puts


async def test_simulation_oldest_first_and_waiting_for_stragglers_keep_late_groups(start_buffer):
    """The stragglers' run with one version per step: taking the oldest buffered groups first
    (--buffer-order oldest_first) drops far fewer late groups than taking them in the order they
    finished, waiting for the stragglers (--straggler-policy wait, the default) drops none, and no
    configuration trains a group beyond the bound."""
    dropped = {}
    for order, stragglers in (("fifo", "drop"), ("oldest_first", "drop"), ("oldest_first", "wait")):
        dropped[order, stragglers] = 0
        for seed in (1, 2, 3):
            config = BufferConfig(buffer_capacity=10, max_staleness=2, buffer_order=order,
                                  straggler_policy=stragglers)
            buffer = await spawn(BufferActor(config, groups_per_step=3))
            try:
                violations, puts, metrics = await simulate(buffer, k=2, groups_per_step=3, steps=40, workers=4,
                                                           max_chunks=4, skip_probability=0.0, seed=seed)
            finally:
                await buffer.stop()
            assert violations == []
            assert metrics["buffer/consumed_groups"] == 40 * 3 and accounted(metrics) == puts
            dropped[order, stragglers] += metrics["buffer/dropped_stale"]
    # seeds 1-3: 8 + 11 + 5, 0 + 1 + 2, 0 + 0 + 0
    assert dropped == {("fifo", "drop"): 24, ("oldest_first", "drop"): 3, ("oldest_first", "wait"): 0}


async def test_oldest_first_takes_the_oldest_groups_and_keeps_the_rest_in_arrival_order(start_buffer):
    buffer = await start_buffer(max_staleness=2)
    for index, version in enumerate([2, 0, 1, 0, 2]):
        await buffer.ask("put", make_group(index, version))
    assert indices(await buffer.ask("get", 2, 2)) == [1, 3]  # the two v0 groups
    assert indices(await buffer.ask("get", 2, 2)) == [0, 2]  # v1, then the first v2 by arrival
    metrics = await buffer.ask("metrics")
    assert metrics["buffer/dropped_stale"] == 0 and metrics["buffer/dropped_stale_frac"] == 0.0


async def test_simulation_long_tail_waiting_for_stragglers_throws_nothing_away():
    """benchmarks/admission_sim.py's H200 long-tail workload, scaled down (G = 8 groups of 8, 10%
    of samples 2,048 tokens, the rest <= 128; k = 2) against the real BufferActor: going ahead of
    the stragglers drops about a fifth of the finished groups (their long samples take more than
    k + 1 steps at the engine's shared rate); waiting for them drops none, keeps the engine busy
    and trains more tokens per second; neither trains a token beyond the bound."""
    from benchmarks.admission_sim import POLICIES, SimConfig, simulate as simulate_long_tail

    results = {}
    for name in ("old", "new"):
        for seed in (1, 2):
            config = SimConfig(groups_per_step=8, train_s=0.4, steps=20, max_staleness=2, seed=seed)
            results[name, seed] = await simulate_long_tail(config, POLICIES[name])
    for (name, seed), r in results.items():
        assert r.violations == 0 and r.trained_groups == 8 * 20, (name, seed)
        if name == "old":
            assert r.dropped_frac > 0.1, seed
        else:
            assert r.dropped_groups == 0 and r.dropped_samples == 0, seed
            assert r.busy_frac >= 0.9, seed
            assert r.trained_tokens_per_s > results["old", seed].trained_tokens_per_s
