"""With --router-api-key, a slime-style plug-in's post() to the run's front carries the key —
and only there, never to the plug-in's other servers."""

from __future__ import annotations

import pytest
from aiohttp import web

from actors.rollout.config import RolloutConfig
from actors.rollout.slime_plugins import SlimePlugins
from slime_async.compat.slime.utils.http_utils import ROUTER_AUTH, post


@pytest.fixture
async def echo_url():
    async def echo(request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_post("/generate", echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    await runner.cleanup()


class Ctx:
    tokenizer = None

    def __init__(self, router_url: str, router_api_key: str | None):
        self.router_url, self.router_api_key = router_url, router_api_key


async def test_posts_to_the_front_carry_the_runs_key(echo_url):
    SlimePlugins(RolloutConfig(), Ctx(echo_url, "k3y"))._authorize_router_posts()
    assert (await post(f"{echo_url}/generate", {}))["authorization"] == "Bearer k3y"


async def test_posts_elsewhere_never_get_the_key(echo_url):
    ROUTER_AUTH.set(("http://127.0.0.1:1", "Bearer k3y"))  # the front lives elsewhere
    assert (await post(f"{echo_url}/generate", {}))["authorization"] is None


async def test_without_a_key_nothing_is_added(echo_url):
    SlimePlugins(RolloutConfig(), Ctx(echo_url, None))._authorize_router_posts()
    assert (await post(f"{echo_url}/generate", {}))["authorization"] is None
