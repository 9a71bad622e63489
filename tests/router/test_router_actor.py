"""RouterActor against fake engines on loopback: affinity, failover, health, pause/resume,
load from /v1/loads, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from actors.router import NoEngineAvailable, RouterError

pytestmark = pytest.mark.asyncio

PARAMS = {"max_new_tokens": 1, "temperature": 0.0}


async def eventually(condition: Callable[[], object], what: str, limit: float = 10.0) -> None:
    """Wait for a background loop to make ``condition`` true (``limit`` only bounds a hang)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


def state_of(engines: list[dict], url: str) -> str:
    return next(e["state"] for e in engines if e["url"] == url)


def load_of(engines: list[dict], url: str) -> float:
    return next(e["load"] for e in engines if e["url"] == url)


async def until_engines(router, condition: Callable[[list[dict]], bool], limit: float = 10.0) -> list[dict]:
    """Poll ``engines()`` until ``condition`` holds (the health/load loops run in the background;
    ``limit`` only bounds a hang)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition(engines := await router.ask("engines")):
        if loop.time() > deadline:
            raise AssertionError(f"engines never reached the expected state: {engines}")
        await asyncio.sleep(0.02)
    return engines


def by_url(fakes):
    return {fake.url: fake for fake in fakes}


async def generate(router, ids, session_id=None, **kwargs):
    return await router.ask("generate", ids, PARAMS, session_id=session_id, timeout=30, **kwargs)


# ----- affinity -------------------------------------------------------------------------------
async def test_every_turn_of_a_session_goes_to_one_engine_and_the_response_names_it(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    served = {(await generate(router, [1, 2, 3] + [9] * turn, "s"))["engine_url"] for turn in range(4)}
    assert len(served) == 1
    assert by_url(fake_engines)[served.pop()].generated() == 4


async def test_sessions_that_start_one_after_another_spread_over_the_engines(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    served = [(await generate(router, [1], f"s{i}"))["engine_url"] for i in range(3)]
    assert sorted(served) == sorted(f.url for f in fake_engines)


async def test_a_session_moves_off_an_engine_whose_reported_load_exceeds_the_threshold(fake_engines, start_router):
    router = await start_router(
        [f.url for f in fake_engines], router_load_interval=0.02, router_imbalance_threshold=4
    )
    first = (await generate(router, [1], "s"))["engine_url"]
    by_url(fake_engines)[first].external_running = 10  # another client keeps it busy
    await until_engines(router, lambda engines: load_of(engines, first) >= 10)
    second = (await generate(router, [1, 7, 2], "s"))["engine_url"]
    assert second != first
    assert (await router.ask("metrics"))["router/session_moves"] == 1


# ----- failover ----------------------------------------------------------------------------------
async def test_a_connection_error_retries_the_request_elsewhere_and_moves_the_session(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    first = (await generate(router, [1, 2], "s"))["engine_url"]
    await by_url(fake_engines)[first].stop()

    second = (await generate(router, [1, 2, 7, 3], "s"))["engine_url"]

    assert second != first
    assert state_of(await router.ask("engines"), first) == "down"
    metrics = await router.ask("metrics")
    assert metrics["router/retries"] == 1
    assert metrics["router/session_moves"] == 1
    assert metrics["router/engines_up"] == 2


async def test_a_stream_that_breaks_off_is_sent_again_to_another_engine(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines], router_stream_generate=True)
    first = (await generate(router, [1, 2], "s"))["engine_url"]  # plain answers to a stream request are taken
    by_url(fake_engines)[first].break_streams = True

    answer = await generate(router, [1, 2, 7, 3], "s")

    assert answer["engine_url"] != first and answer["output_ids"] == [7]
    assert state_of(await router.ask("engines"), first) == "down"
    assert (await router.ask("metrics"))["router/retries"] == 1


async def test_a_request_fails_with_the_engine_url_when_retries_are_exhausted(fake_engines, start_router):
    router = await start_router([fake_engines[0].url], router_request_retries=0)
    await fake_engines[0].stop()
    with pytest.raises(RouterError, match=f"{fake_engines[0].url}"):
        await generate(router, [1])


async def test_with_every_engine_down_a_request_fails_after_the_no_engine_timeout(fake_engines, start_router):
    router = await start_router(
        [f.url for f in fake_engines], router_no_engine_timeout=0.2, router_request_retries=3
    )
    for fake in fake_engines:
        await fake.stop()
    with pytest.raises(NoEngineAvailable, match="--router-no-engine-timeout") as raised:
        await generate(router, [1])
    assert all(fake.url in str(raised.value) for fake in fake_engines)


async def test_an_engine_failing_health_checks_is_marked_down_and_rejoins_when_healthy(fake_engines, start_router):
    sick = fake_engines[1]
    router = await start_router([f.url for f in fake_engines], router_health_interval=0.02, router_health_failures=2)
    sick.healthy = False
    await until_engines(router, lambda engines: state_of(engines, sick.url) == "down")
    for i in range(6):
        assert (await generate(router, [1], f"s{i}"))["engine_url"] != sick.url
    sick.healthy = True
    await until_engines(router, lambda engines: state_of(engines, sick.url) == "up")


async def test_requests_on_a_hung_engine_fail_over_once_health_checks_mark_it_down(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url, b.url], router_health_interval=0.02, router_health_failures=2)
    a.hold = True  # accepts requests, never answers
    held = asyncio.ensure_future(generate(router, [1], "s"))
    await eventually(lambda: a.running == 1, "the request hangs on a")
    a.healthy = False
    response = await held
    assert response["engine_url"] == b.url
    assert (await router.ask("metrics"))["router/retries"] == 1


async def test_an_engine_that_listens_again_on_its_port_rejoins(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines], router_health_interval=0.02)
    dead = fake_engines[0]
    await dead.stop()
    served = {(await generate(router, [1], f"s{i}"))["engine_url"] for i in range(4)}
    assert dead.url not in served
    assert state_of(await router.ask("engines"), dead.url) == "down"
    await dead.start()  # same port, like a supervisor restarting the process
    await until_engines(router, lambda engines: state_of(engines, dead.url) == "up")
    # the least-loaded placement now sends a new session to the rejoined, emptiest engine
    assert (await generate(router, [1], "new"))["engine_url"] == dead.url


async def test_removed_engine_gets_no_requests_and_a_registered_one_does(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url, b.url])
    await router.ask("remove_engine", a.url)
    assert {(await generate(router, [1], f"s{i}"))["engine_url"] for i in range(3)} == {b.url}
    described = await router.ask("register_engine", c.url)
    assert described["state"] == "up"
    assert (await generate(router, [1], "fresh"))["engine_url"] == c.url


# ----- weight sync ----------------------------------------------------------------------------------
async def test_drain_pause_waits_for_in_flight_and_holds_new_requests_until_resume(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    for fake in fake_engines:
        fake.hold = True
    running = asyncio.ensure_future(generate(router, [1], "s"))
    await eventually(lambda: sum(f.running for f in fake_engines) == 1, "the request reaches an engine")

    pausing = asyncio.ensure_future(router.ask("pause", "drain"))
    waiting = asyncio.ensure_future(generate(router, [2], "t"))
    await asyncio.sleep(0.1)
    assert not pausing.done()  # one request still runs
    for fake in fake_engines:
        fake.hold = False
        fake.release()
    assert (await running)["meta_info"]["finish_reason"]["type"] == "length"
    await pausing
    await asyncio.sleep(0.1)
    assert sum(f.generated() for f in fake_engines) == 1  # the waiting request was not sent
    assert not waiting.done()

    assert set((await router.ask("resume", "0")).values()) == {"up"}
    assert (await waiting)["meta_info"]["finish_reason"]["type"] == "length"


async def test_abort_pause_returns_in_flight_requests_with_finish_abort(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    for fake in fake_engines:
        fake.hold = True
    running = [asyncio.ensure_future(generate(router, [1], f"s{i}")) for i in range(3)]
    await eventually(lambda: sum(f.running for f in fake_engines) == 3, "requests reach the engines")

    await router.ask("pause", "abort")

    finishes = [(await request)["meta_info"]["finish_reason"]["type"] for request in running]
    assert finishes == ["abort"] * 3
    assert all("/abort_request" in fake.paths for fake in fake_engines)


async def test_resume_confirms_versions_and_keeps_a_mismatching_engine_out(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([f.url for f in fake_engines], router_health_interval=0.02)
    await router.ask("pause", "drain")
    a.weight_version = c.weight_version = "1"  # b missed the update

    states = await router.ask("resume", "1")

    assert states == {a.url: "up", b.url: "stale", c.url: "up"}
    served = {(await generate(router, [1], f"s{i}"))["engine_url"] for i in range(6)}
    assert served == {a.url, c.url}
    b.weight_version = "1"
    await until_engines(router, lambda engines: state_of(engines, b.url) == "up")


async def test_nothing_reaches_a_paused_engine_until_its_version_is_confirmed(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url], router_health_interval=0.01, router_load_interval=0.01)
    await router.ask("pause", "drain")
    a.paths.clear()
    waiting = asyncio.ensure_future(generate(router, [1], "s"))
    await asyncio.sleep(0.2)  # several health and load intervals
    assert a.paths == []
    a.weight_version = "3"
    await router.ask("resume", 3)
    assert a.paths[0] == "/get_model_info"  # the version check comes first
    assert (await waiting)["engine_url"] == a.url


async def test_an_answer_with_other_weights_than_expected_takes_the_engine_out(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url, b.url])
    await router.ask("pause", "drain")
    a.weight_version = b.weight_version = "1"
    await router.ask("resume", "1")
    a.weight_version = "0"  # restarted between two health checks: initial weights again
    served = [(await generate(router, [1], "s"))["engine_url"] for _ in range(3)]
    assert served == [a.url, b.url, b.url]  # a's answer gives it away; the session moves
    assert state_of(await router.ask("engines"), a.url) == "stale"


# ----- metrics --------------------------------------------------------------------------------------
async def test_metrics_count_requests_and_the_prefix_cache_hit_rate(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines])
    await generate(router, [1, 2, 3], "s")  # 3 prompt tokens, 0 cached
    served = (await generate(router, [1, 2, 3, 7, 4, 5], "s"))["engine_url"]  # 6 prompt, 3 cached
    metrics = await router.ask("metrics")
    tag = served.split("://")[1]
    assert metrics["router/requests"] == 2
    assert metrics[f"router/{tag}/requests"] == 2
    assert metrics["router/prefix_cache_hit_rate"] == pytest.approx(3 / 9)
    assert metrics[f"router/{tag}/sessions"] == 1
    assert metrics["router/in_flight"] == 0
    assert (metrics["router/routed_placed"], metrics["router/routed_affinity"]) == (1, 1)


async def test_pausing_one_engine_sends_its_sessions_elsewhere_until_it_is_resumed(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url, b.url])
    assert (await generate(router, [1], "s"))["engine_url"] == a.url
    await router.ask("pause", "drain", [a.url])
    a.paths.clear()
    assert [(await generate(router, [1, 2], "s"))["engine_url"] for _ in range(3)] == [b.url] * 3
    assert a.paths == []
    assert await router.ask("resume", "0", [a.url]) == {a.url: "up"}
    assert (await generate(router, [1], "new"))["engine_url"] == a.url  # the emptiest engine again


# ----- policies through the actor ---------------------------------------------------------------------
async def test_round_robin_policy_rotates_even_the_turns_of_one_session(fake_engines, start_router):
    router = await start_router([f.url for f in fake_engines], router_policy="round_robin")
    served = [(await generate(router, [1], "s"))["engine_url"] for _ in range(3)]
    assert served == [f.url for f in fake_engines]


async def test_requests_without_session_go_to_the_least_loaded_engine(fake_engines, start_router):
    a, b, c = fake_engines
    router = await start_router([a.url, b.url])
    a.hold = True
    held = asyncio.ensure_future(generate(router, [1]))
    await eventually(lambda: a.running == 1, "the first request is held on a")
    assert [(await generate(router, [2]))["engine_url"] for _ in range(2)] == [b.url, b.url]
    a.hold = False
    a.release()
    await held


async def test_reported_load_counts_at_once_and_is_forgotten_gradually(fake_engines, start_router):
    a = fake_engines[0]
    router = await start_router([a.url], router_load_interval=0.02)
    a.external_running = 10
    await until_engines(router, lambda engines: load_of(engines, a.url) == 10)
    a.external_running = 0
    loads = []
    await until_engines(router, lambda engines: loads.append(load_of(engines, a.url)) or loads[-1] < 1)
    assert any(0 < load < 10 for load in loads)  # it went down in steps, not in one jump
