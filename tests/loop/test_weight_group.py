"""actors.weight_sync.distributed: a failed sync leaves no call running, and a rebuild destroys the old
group on every old member (stand-in engines: tiny real HTTP servers on 127.0.0.1)."""

import asyncio

import pytest
from aiohttp import web

from actors.weight_sync.distributed import EngineSetGroup, send_weights
from slime_async.weights.protocol import TensorMeta
from slime_async.actor import Actor, spawn
from slime_async.engine_client import EngineClient, EngineHTTPError


class _Trainer(Actor):
    """Answers at once, except a broadcast, which waits for receivers that never come."""

    def __init__(self):
        super().__init__("trainer")
        self.calls: list[tuple[str, ...]] = []

    async def weight_master(self) -> tuple[str, int]:
        return "127.0.0.1", 1

    async def init_weight_group(self, spec) -> None:
        self.calls.append(("init", spec.group_name, spec.timeout))

    async def destroy_weight_group(self, name: str) -> None:
        self.calls.append(("destroy", name))

    async def weight_metadata(self) -> list[list[TensorMeta]]:
        return [[TensorMeta("w", "float32", (2,))], [TensorMeta("b", "float32", (2,))]]

    async def broadcast_weights(self, name: str, flattened: bool = True) -> int:
        await asyncio.sleep(3600)
        return 2


class _Engine:
    """An engine's weight-group routes; ``refuse`` answers the update with success=false, else it waits."""

    def __init__(self, refuse: bool = False):
        self.refuse, self.calls, self.cancelled = refuse, [], 0
        self.app = web.Application()
        for route in ("init_weights_update_group", "destroy_weights_update_group", "update_weights_from_distributed"):
            self.app.router.add_post(f"/{route}", self._handler(route))

    def _handler(self, route: str):
        async def handle(request: web.Request) -> web.Response:
            body = await request.json()
            self.calls.append((route, body.get("group_name")))
            if route == "update_weights_from_distributed":
                if self.refuse:
                    return web.json_response({"success": False, "message": "no such group"})
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:  # the client went away: nobody waits for this POST any more
                    self.cancelled += 1
                    raise
            return web.json_response({"success": True})
        return handle

    async def start(self) -> str:
        self.runner = web.AppRunner(self.app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def setup():
    trainer = await spawn(_Trainer())
    engines = [_Engine(), _Engine(refuse=True)]
    urls = [await e.start() for e in engines]
    clients = [EngineClient(url, timeout=30) for url in urls]
    yield trainer, engines, clients
    for client in clients:
        await client.close()
    for engine in engines:
        await engine.runner.cleanup()
    await trainer.stop()


async def test_a_refused_update_cancels_the_other_calls_and_the_group_times_out_with_the_sync(setup):
    trainer, engines, clients = setup
    group = EngineSetGroup(trainer, "gloo", timeout=30)
    spec = await group.ensure(clients, ["a", "b"], [1, 2], 3)
    assert trainer.actor.calls == [("init", "weights-g1", 30)]  # the trainer's collectives end with the sync's timeout
    with pytest.raises(EngineHTTPError, match="no such group"):
        await asyncio.wait_for(send_weights(trainer, clients, spec.group_name, "1", timeout=30), 10)
    for _ in range(50):  # the cancelled POST reaches the server as a closed connection
        if engines[0].cancelled:
            break
        await asyncio.sleep(0.02)
    assert engines[0].cancelled == 1  # plain gather left it waiting, owned by nobody


async def test_a_rebuild_destroys_the_old_group_on_an_engine_that_left_the_set_and_uses_a_new_name(setup):
    trainer, engines, clients = setup
    group = EngineSetGroup(trainer, "gloo", timeout=30)
    await group.ensure(clients, ["a", "b"], [1, 2], 3)
    spec = await group.ensure(clients[:1], ["a"], [1], 2)  # the second engine was marked down, still alive
    assert spec.group_name == "weights-g2"
    assert ("destroy_weights_update_group", "weights-g1") in engines[1].calls
    assert ("destroy_weights_update_group", "weights-g1") in engines[0].calls
    assert ("destroy", "weights-g1") in trainer.actor.calls
