"""What a disk sync sends an engine, in order, per quiesce mode: SGLang's scheduler asserts (and
its server exits) on a cache flush while requests are in its batch, so no update may flush, and a
flush is sent only where the engine can be idle (after abort or drain, as a deferred flush that
waits for it), or left pending with an engine that holds requests (in_place, retract)."""

import asyncio
import contextlib

import pytest
from aiohttp import web

from actors.weight_sync.actor import WeightSyncActor
from slime_async.actor import Actor, spawn


class _Engine:
    """Records each control request as (path, body or query). With ``hold_flushes``, a flush waits
    for ``idle`` before it answers, as SGLang defers one while requests run."""

    def __init__(self, hold_flushes: bool = False) -> None:
        self.seen: list[tuple[str, object]] = []
        self.hold_flushes, self.idle = hold_flushes, asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else dict(request.query)
        self.seen.append((request.path, body))
        if request.path == "/flush_cache":
            if self.hold_flushes:
                await self.idle.wait()
            return web.Response(text="Cache flushed.\n")
        return web.json_response({"success": True, "message": "ok"})


@contextlib.asynccontextmanager
async def serving(engine: _Engine):
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", engine.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class _Router(Actor):
    def __init__(self, url: str):
        super().__init__("router")
        self.url, self.calls = url, []

    async def pause(self, mode: str, urls=None) -> None:
        self.calls.append(("pause", mode))

    async def engines(self) -> list[dict]:
        return [{"url": self.url, "health": "up", "paused": False}]

    async def resume(self, version: str, urls=None) -> dict[str, str]:
        self.calls.append(("resume", version))
        return {self.url: "up"}


class _Trainer(Actor):
    def __init__(self):
        super().__init__("trainer")

    async def export_hf(self, path: str) -> None:
        pass


async def two_syncs(mode: str, tmp_path) -> tuple[list, list, dict]:
    # The engine stays busy through both syncs when it holds requests: its flushes wait.
    engine = _Engine(hold_flushes=mode in ("in_place", "retract"))
    async with serving(engine) as url:
        router, trainer = await spawn(_Router(url)), await spawn(_Trainer())
        sync = await spawn(WeightSyncActor(trainer, router, "disk", mode, tmp_path))
        try:
            for version in (1, 2):
                await sync.ask("sync", version)
                async with asyncio.timeout(10):  # a flush left with the engine goes out after the sync
                    while engine.hold_flushes and not any(p == "/flush_cache" for p, _ in engine.seen):
                        await asyncio.sleep(0.01)
            metrics = await sync.ask("metrics")
            engine.idle.set()
        finally:
            for ref in (sync, router, trainer):
                await ref.stop()
    return engine.seen, router.actor.calls, metrics


@pytest.mark.parametrize("mode", ["abort", "drain"])
async def test_after_abort_or_drain_the_update_does_not_flush_and_a_deferred_flush_precedes_the_resume(mode, tmp_path):
    seen, calls, metrics = await two_syncs(mode, tmp_path)
    assert [path for path, _ in seen] == ["/update_weights_from_disk", "/flush_cache"] * 2
    assert metrics["perf/weight_sync_deferred_flushes"] == 0
    assert all(body["flush_cache"] is False for path, body in seen if path == "/update_weights_from_disk")
    assert all(float(body["timeout"]) > 0 for path, body in seen if path == "/flush_cache")  # waits for idle
    assert calls == [("pause", mode), ("resume", "1"), ("pause", mode), ("resume", "2")]


@pytest.mark.parametrize("mode", ["in_place", "retract"])
async def test_with_requests_held_through_the_update_one_flush_is_left_pending_for_the_engines_idle_moment(
        mode, tmp_path):
    seen, calls, metrics = await two_syncs(mode, tmp_path)
    updates = [body for path, body in seen if path == "/update_weights_from_disk"]
    assert len(updates) == 2 and all(body["flush_cache"] is False for body in updates)
    flushes = [body for path, body in seen if path == "/flush_cache"]
    # One at a time: the second sync leaves none while the first still waits for the engine's idle moment.
    assert metrics["perf/weight_sync_deferred_flushes"] == 1
    assert len(flushes) == 1 and float(flushes[0]["timeout"]) >= 60
    assert calls == [("pause", mode), ("resume", "1"), ("pause", mode), ("resume", "2")]
