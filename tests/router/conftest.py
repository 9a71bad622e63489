"""Fixtures for router tests: scriptable fake engines on loopback (real HTTP, aiohttp servers)
and a router actor in front of them. Tests with real CPU engines build their own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from actors.router import RouterActor, RouterConfig
from slime_async.actor import ActorRef, spawn
from slime_async.net import free_port
from examples.models.tiny import build_tiny_model


@dataclass
class FakeEngine:
    """Speaks the part of SGLang's API the router uses; every request is recorded.

    ``hold`` keeps /generate requests open until ``release()`` or ``/abort_request``; a streamed
    /generate is answered with the plain answer (an engine that does not stream) unless
    ``break_streams``;
    ``cached_tokens`` answers the prefix this engine has seen before (prompt ids as a
    prefix cache); ``healthy`` answers /health_generate; ``external_running`` is added to
    /v1/loads as if another client kept requests running.
    """

    name: str
    port: int = 0
    healthy: bool = True
    weight_version: str = "0"
    external_running: int = 0
    hold: bool = False
    # A streamed /generate (``stream: true``) sends its first chunk and then closes the connection.
    break_streams: bool = False
    paths: list[str] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    running: int = 0
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _aborted: asyncio.Event = field(default_factory=asyncio.Event)
    _seen_prefixes: set[tuple[int, ...]] = field(default_factory=set)
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def generated(self) -> int:
        return self.paths.count("/generate")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_post("/abort_request", self._abort)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        if self.port == 0:
            self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        """Close the listening socket and every open connection, like a killed process."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def release(self) -> None:
        self._released.set()
        self._released = asyncio.Event()

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        body = orjson.loads(await request.read())
        if body.get("stream") and self.break_streams:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            chunk = {"output_ids": [7], "meta_info": {"completion_tokens": 1, "finish_reason": None,
                                                      "weight_version": self.weight_version}}
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            request.transport.close()
            return response
        ids = list(body["input_ids"])
        self.prompts.append(ids)
        cached = max((n for n in range(len(ids) + 1) if tuple(ids[:n]) in self._seen_prefixes), default=0)
        self._seen_prefixes.update(tuple(ids[:n]) for n in range(1, len(ids) + 1))
        finish = "length"
        self.running += 1
        try:
            if self.hold:
                released, aborted = self._released, self._aborted
                waits = [asyncio.ensure_future(released.wait()), asyncio.ensure_future(aborted.wait())]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                for wait in waits:
                    wait.cancel()
                if aborted.is_set():
                    finish = "abort"
        finally:
            self.running -= 1
        return _json({
            "output_ids": [7],
            "meta_info": {
                "output_token_logprobs": [[-0.5, 7, None]],
                "finish_reason": {"type": finish},
                "prompt_tokens": len(ids),
                "completion_tokens": 1,
                "cached_tokens": cached,
                "weight_version": self.weight_version,
            },
        })

    async def _health(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return web.Response(status=200 if self.healthy else 503)

    async def _loads(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return _json({"loads": [{"num_running_reqs": self.running + self.external_running, "num_waiting_reqs": 0}]})

    async def _model_info(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        return _json({"model_path": self.name, "weight_version": self.weight_version})

    async def _abort(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        self._aborted.set()
        self._aborted = asyncio.Event()
        return _json({"success": True})


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")




@pytest_asyncio.fixture
async def fake_engines() -> AsyncIterator[list[FakeEngine]]:
    """Three fake engines, started; stopped after the test."""
    engines = [FakeEngine(name) for name in ("a", "b", "c")]
    for engine in engines:
        await engine.start()
    yield engines
    for engine in engines:
        engine.release()
        await engine.stop()


@pytest_asyncio.fixture
async def start_router() -> AsyncIterator[Callable[..., Any]]:
    """``await start_router(urls, **config_fields)`` spawns a router; all are stopped after."""
    refs: list[ActorRef] = []

    async def start(urls: list[str], **fields: Any) -> ActorRef:
        # Long health/load intervals by default: a test that wants the loops sets them.
        defaults = {"router_health_interval": 3600.0, "router_load_interval": 0.0}
        ref = await spawn(RouterActor(RouterConfig(**(defaults | fields)), urls))
        refs.append(ref)
        return ref

    yield start
    for ref in refs:
        await ref.stop()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Qwen2 for the real CPU engines (read-only)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("router-tiny-qwen2"), arch="qwen2", seed=0))
