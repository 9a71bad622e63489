"""The router in front of three real CPU engines, each a supervised process child on loopback:
one engine is killed mid-run, every request still completes, the dead engine's sessions move,
and the engine rejoins after its supervisor restarts it on the same port."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from actors.router import RouterActor, RouterConfig
from slime_async.actor import ActorRef, spawn
from slime_async.process import ProcessChild, ProcessSpec, http_ready
from slime_async.supervisor import ChildSpec, Restart, Supervisor
from tests.router.conftest import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 9
TURNS = 4
PARAMS = {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True}


def engine_supervisor(name: str, model_dir: str, port: int, log_dir: Path) -> Supervisor:
    """One CPU engine as a permanent process child: a killed engine is restarted on its port."""
    url = f"http://127.0.0.1:{port}"
    spec = ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", "actors.engine.cpu", "--model-path", model_dir,
              "--host", "127.0.0.1", "--port", str(port)],
        env={"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"},
        cwd=str(REPO_ROOT),
        ready=http_ready(url + "/health"),
        stop_timeout=5.0,
    )

    async def start() -> ActorRef:
        return await spawn(ProcessChild(spec, log_dir))

    return Supervisor(f"{name}-sup", [ChildSpec(name, start, Restart.PERMANENT)], max_restarts=3, max_seconds=300)


async def engine_pid(supervisor: ActorRef, name: str) -> int:
    child = await supervisor.ask("child", name)
    return child.actor.pid


async def until(router: ActorRef, condition, what: str, limit: float = 180.0) -> list[dict]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not condition(engines := await router.ask("engines")):
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}; engines: {engines}")
        await asyncio.sleep(0.05)
    return engines


async def conversation(router: ActorRef, session: str, served: list[tuple[str, int, str]]) -> list[dict]:
    """One multi-turn session: each turn's prompt is the previous prompt + answer + new tokens."""
    ids = [3 + int(session[1:])] + list(range(10, 30))
    responses = []
    for turn in range(TURNS):
        response = await router.ask("generate", ids, PARAMS, session_id=session, timeout=120)
        served.append((session, turn, response["engine_url"]))
        responses.append(response)
        ids = ids + response["output_ids"] + list(range(40, 48))
    return responses


@pytest.mark.asyncio
@pytest.mark.timeout(600)
async def test_a_killed_engine_loses_no_request_its_sessions_move_and_it_rejoins(tiny_model_dir, tmp_path):
    names = ["engine0", "engine1", "engine2"]
    ports = [free_port() for _ in names]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    # One supervisor per engine so the three (slow-starting) engines start in parallel.
    supervisors = await asyncio.gather(
        *(spawn(engine_supervisor(name, tiny_model_dir, port, tmp_path)) for name, port in zip(names, ports))
    )
    # No rebalancing (threshold 100): every session move in this test is a failover, and moved
    # sessions stay where they went even when the restarted engine comes back empty.
    config = RouterConfig(router_health_interval=0.2, router_health_failures=2, router_load_interval=0.0,
                          router_request_retries=2, router_imbalance_threshold=100)
    router = await spawn(RouterActor(config, urls))
    try:
        served: list[tuple[str, int, str]] = []
        sessions = [asyncio.ensure_future(conversation(router, f"s{i}", served)) for i in range(SESSIONS)]

        # Kill, mid-run, an engine that has requests in flight. Once every session has a turn
        # served, a request in flight is a later turn of a session that lives on its engine;
        # before that (a loaded machine serves unevenly) they may all be first turns, whose
        # sessions have no engine to move from.
        engines = await until(router, lambda es: len({s for s, _, _ in served}) == SESSIONS
                              and any(e["in_flight"] >= 2 for e in es),
                              "requests in flight after every session's first turn")
        victim = next(i for i, e in enumerate(engines) if e["in_flight"] >= 2)
        old_pid = await engine_pid(supervisors[victim], names[victim])
        killed_at = len(served)
        os.kill(old_pid, signal.SIGKILL)

        results = await asyncio.gather(*sessions)

        # every request completed (the ones on the dead engine were retried elsewhere)
        assert len(served) == SESSIONS * TURNS
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for turns in results for r in turns)
        metrics = await router.ask("metrics")
        assert metrics["router/retries"] >= 1
        assert metrics["router/engine_down_events"] >= 1
        # sessions that lived on the dead engine moved: their later turns ran elsewhere
        last_before_kill = {s: url for s, _, url in served[:killed_at]}
        after_kill = {s: [url for s2, _, url in served[killed_at:] if s2 == s] for s in last_before_kill}
        moved = [s for s, url in last_before_kill.items() if url == urls[victim] and after_kill[s]]
        assert moved
        # A session's first turn counted after the kill may be a response the victim sent just
        # before it died (its task appends it after this test's kill): the later turns ran elsewhere.
        assert all(urls[victim] not in after_kill[s][1:] for s in moved), after_kill
        assert metrics["router/session_moves"] >= 1

        # the supervisor restarts the engine on its port; the router lets it back in
        await until(router, lambda es: es[victim]["state"] == "up", "the restarted engine rejoins")
        assert await engine_pid(supervisors[victim], names[victim]) != old_pid
        for session in {s for s, _, _ in served}:
            await router.ask("end_session", session)
        fresh = [(await router.ask("generate", [5, 6, 7], PARAMS, session_id=f"new{i}", timeout=120))["engine_url"]
                 for i in range(3)]
        assert sorted(fresh) == sorted(urls)  # new sessions spread over all three again
    finally:
        await router.stop()
        await asyncio.gather(*(supervisor.stop() for supervisor in supervisors))
