"""Fixtures for the router's HTTP front: a tiny model with a tool-calling chat template, one real
CPU engine shared by the module's tests, scriptable fake engines, and a router with its front."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
from aiohttp import web

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from actors.router import RouterActor, RouterConfig
from actors.router.text_model import TextModel
from slime_async.actor import ActorRef, spawn
from slime_async.net import free_port
from examples.models.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model, set_chat_template

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def with_tool_template(model_dir: Path) -> Path:
    return set_chat_template(model_dir, TOOL_CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def chat_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 whose chat template renders tools (read-only)."""
    return with_tool_template(build_tiny_model(tmp_path_factory.mktemp("front-tiny-qwen2"), arch="qwen2", seed=0))


@pytest.fixture(scope="session")
def text_model(chat_model_dir: Path) -> TextModel:
    return TextModel.load(chat_model_dir)


@pytest.fixture(scope="session")
def cpu_engine(chat_model_dir: Path) -> Iterator[str]:
    """One real CPU engine for the session's front tests (start-up costs seconds of imports)."""
    log_path = Path(tempfile.mkdtemp(prefix="front-engine-")) / "engine.log"
    process, url = start_local_engine(chat_model_dir, log_path, timeout=180)
    try:
        yield url
    finally:
        stop_local_engine(process)


@contextlib.contextmanager
def standalone_router(engine_url: str, model_dir: Path, api_key: str) -> Iterator[str]:
    """``slime-async router`` as its own process over ``engine_url``; yields the URL it logs."""
    process = subprocess.Popen(
        [sys.executable, "-m", "actors.loop.cli", "router", "--engine-url", engine_url,
         "--model-path", str(model_dir), "--port", "0", "--api-key", api_key],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline, seen = None, time.monotonic() + 120, []
        while url is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"router listening on (http://\S+)", line)
            url = match.group(1) if match else None
        assert url is not None, "".join(seen)
        yield url
    finally:
        process.terminate()
        assert process.wait(timeout=30) in (0, 128 + 15, -15)


@pytest_asyncio.fixture
async def start_front() -> AsyncIterator[Callable[..., Any]]:
    """``ref, url = await start_front(engine_urls, model, **router_config)``; stopped after the test."""
    refs: list[ActorRef] = []

    async def start(urls: list[str], model: TextModel, **fields: Any) -> tuple[ActorRef, str]:
        defaults = {"router_health_interval": 3600.0, "router_load_interval": 0.0}
        ref = await spawn(RouterActor(RouterConfig(**(defaults | fields)), urls, model=model))
        refs.append(ref)
        return ref, await ref.ask("front_url")

    yield start
    for ref in refs:
        await ref.stop()


@dataclass
class ScriptedEngine:
    """A fake engine that answers the next scripted completion, ``max_new_tokens`` at a time.

    Each script entry is a list of token ids; a request gets the next tokens of the current
    entry (so chunked requests continue it) and finish ``stop`` once the entry is used up.
    ``abort_after`` makes the next request end with finish ``abort`` after that many tokens and
    then switches ``weight_version`` to ``version_after_abort``, as a weight sync would.
    Logprob of a token at position p of its entry: -(p + 1) / 100.
    """

    script: list[list[int]] = field(default_factory=list)
    weight_version: str = "0"
    abort_after: int | None = None
    version_after_abort: str = "1"
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    _entry: int = 0
    _emitted: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/model_info", self._model_info)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _model_info(self, _request: web.Request) -> web.Response:
        return _json({"weight_version": self.weight_version})

    async def _generate(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        entry = self.script[self._entry]
        budget = body["sampling_params"].get("max_new_tokens")
        budget = len(entry) if budget is None else budget
        take = min(budget, len(entry) - self._emitted)
        finish: dict[str, Any] = {"type": "length", "length": budget}
        version = self.weight_version
        if self.abort_after is not None:
            take, finish = min(take, self.abort_after), {"type": "abort", "message": "weight sync"}
            self.abort_after, self.weight_version = None, self.version_after_abort
        start = self._emitted
        ids = entry[start:start + take]
        self._emitted += take
        if finish["type"] != "abort" and self._emitted == len(entry):
            finish = {"type": "stop", "matched": entry[-1]}
            self._entry, self._emitted = min(self._entry + 1, len(self.script) - 1), 0
        logprobs = [[-(start + i + 1) / 100, t, None] for i, t in enumerate(ids)]
        return _json({"output_ids": ids, "meta_info": {
            "finish_reason": finish, "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(ids),
            "cached_tokens": 0, "weight_version": version, "output_token_logprobs": logprobs}})


def _json(payload: Any) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


@pytest_asyncio.fixture
async def scripted_engine() -> AsyncIterator[ScriptedEngine]:
    engine = ScriptedEngine()
    await engine.start()
    yield engine
    await engine.stop()
