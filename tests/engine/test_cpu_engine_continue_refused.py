"""A real CPU engine behind a tiny HTTP proxy that refuses /continue_generation: after an in-place
pause, the router's resume takes the engine down and abandons its requests (instead of routing to
an engine that stays paused forever); once the engine continues again, the health loop brings it
back. The shared engine is continued directly afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from actors.router import RouterActor, RouterConfig
from actors.router.errors import RouterError
from slime_async.actor import spawn

LONG = {"temperature": 0, "max_new_tokens": 96, "ignore_eos": True}


class RefusingProxy:
    """Forwards every request to ``upstream``; answers /continue_generation with 500 while ``refuse``."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.refuse = True
        self.url = ""

    async def forward(self, request: web.Request) -> web.Response:
        if request.path == "/continue_generation" and self.refuse:
            return web.Response(status=500, text="refused by the test proxy")
        async with aiohttp.ClientSession() as http, http.request(
                request.method, self.upstream + request.path_qs, data=await request.read(),
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")}) as resp:
            return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)


@pytest.fixture
async def proxy(engine_url: str) -> AsyncIterator[RefusingProxy]:
    proxy = RefusingProxy(engine_url)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    proxy.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    try:
        yield proxy
    finally:
        await runner.cleanup()
        # The shared engine runs again whatever happened above, without the abandoned request
        # (it would take a slot from the next test).
        async with aiohttp.ClientSession() as http:
            async with http.post(engine_url + "/continue_generation") as resp:
                assert resp.status == 200
            async with http.post(engine_url + "/abort_request", json={"abort_all": True}) as resp:
                assert resp.status == 200


async def decode_steps(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/server_info") as resp:
        return (await resp.json())["internal_states"][0]["num_decode_steps"]


async def test_a_refused_continue_takes_the_engine_down_and_its_requests_fail_over_until_it_continues(proxy):
    config = RouterConfig(router_request_retries=0, router_health_interval=0.2, router_no_engine_timeout=5)
    router = await spawn(RouterActor(config, [proxy.url]))
    try:
        before = await decode_steps(proxy.upstream)
        request = asyncio.ensure_future(router.ask("generate", [5, 6, 7], LONG, timeout=60))
        async with asyncio.timeout(30):
            while await decode_steps(proxy.upstream) < before + 4:
                await asyncio.sleep(0.01)
        await router.ask("pause", "in_place")
        states = await router.ask("resume", None)
        assert states == {proxy.url: "down"}
        with pytest.raises(RouterError, match="abandoned: engine marked down"):
            async with asyncio.timeout(10):  # without the fix it waits on the paused engine for good
                await request
        await asyncio.sleep(0.6)  # three health intervals: the continue is refused each time
        [engine] = await router.ask("engines")
        assert engine["state"] == "down" and "continue_generation failed" in engine["down_reason"]
        proxy.refuse = False
        async with asyncio.timeout(10):
            while (await router.ask("engines"))[0]["state"] != "up":
                await asyncio.sleep(0.05)
        fresh = await router.ask("generate", [5, 6, 7], {**LONG, "max_new_tokens": 4}, timeout=30)
    finally:
        await router.stop()
    assert len(fresh["output_ids"]) == 4
