"""The tensor transport: its start check (IPC handles only reach engines on the trainer's own
devices), and a sync where one engine fails: the others get every bucket, the failed one is
reported, and one left holding a part of the new weights under the new version stops the sync."""

import socket

import pytest
from aiohttp import ClientSession, web

from actors.weight_sync.errors import WeightSyncError
from actors.weight_sync.tensor import TensorTransport
from slime_async.actor import Actor, spawn
from slime_async.engine_client import EngineClient, EngineHTTPError, EngineUnreachable


class _Trainer(Actor):
    """What the ranks report of their GPUs: the pids NVML lists there, or None (CPU, or NVML blind)."""

    def __init__(self, pids):
        super().__init__("trainer")
        self.pids = pids

    async def device_pids(self):
        return self.pids


async def check(url: str, trainer_pids, engine_pids: set[int]) -> None:
    trainer = await spawn(_Trainer(trainer_pids))
    try:
        await TensorTransport(trainer, engine_pids=lambda _: engine_pids).check([EngineClient(url)])
    finally:
        await trainer.stop()


async def test_an_engine_on_another_host_is_refused_naming_it_and_the_way_out():
    with pytest.raises(WeightSyncError, match=r"engine http://10\.1\.2\.3:30000 is not on this host.*"
                                              r"--update-weight-transport distributed"):
        await check("http://10.1.2.3:30000", [11, 12], {12})


async def test_an_engine_whose_processes_are_on_another_gpu_is_refused():
    with pytest.raises(WeightSyncError, match=r"engine http://127\.0\.0\.1:30000 runs on another GPU than the trainer"):
        await check("http://127.0.0.1:30000", [11, 12], {40, 41})


async def test_an_engine_with_a_process_on_the_trainers_gpu_is_accepted():
    await check("http://127.0.0.1:30000", [11, 41], {40, 41})


async def test_on_cpu_every_local_engine_shares_the_trainers_device():
    await check("http://localhost:30000", None, {40})



class _Exporter(Actor):
    """A one-rank trainer exporting two buckets; counts the exports it was asked to end."""

    def __init__(self):
        super().__init__("trainer")
        self.buckets = iter([["bucket-1"], ["bucket-2"]])
        self.ended = 0

    async def rank_info(self):
        return [{"rank": 0}]

    async def next_tensor_bucket(self, serving):
        return next(self.buckets, None)

    async def end_tensor_export(self):
        self.ended += 1


class _Engine:
    """A loopback engine that takes buckets (as SGLang does, an update it answers with success sets its
    weight version) and answers 400 to the bucket numbered ``refuse``."""

    def __init__(self, refuse: int | None = None):
        self.refuse, self.buckets, self.version = refuse, [], "0"

    async def update(self, request: web.Request) -> web.Response:
        body = await request.json()
        if len(self.buckets) + 1 == self.refuse:
            return web.json_response({"success": False, "message": "shape mismatch"}, status=400)
        self.buckets.append(body["serialized_named_tensors"][0])
        self.version = body["weight_version"]
        return web.json_response({"success": True, "message": "ok"})

    async def server_info(self, _: web.Request) -> web.Response:
        return web.json_response({"tp_size": 1})

    async def model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.version})

    async def serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/update_weights_from_tensor", self.update)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/model_info", self.model_info)
        runner = web.AppRunner(app, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def _closed_port_url() -> str:
    with socket.socket() as sock:  # bound, then closed: nothing listens there (an engine killed -9)
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _sync(engines: list["_Engine | None"]) -> tuple[list[object], _Exporter]:
    """Version 3 into ``engines`` (None: one that is gone) through a TensorTransport."""
    exporter = _Exporter()
    trainer = await spawn(exporter)
    runners, urls = [], []
    for engine in engines:
        if engine is None:
            urls.append(_closed_port_url())
        else:
            runner, url = await engine.serve()
            runners.append(runner)
            urls.append(url)
    try:
        async with ClientSession() as session:
            clients = [EngineClient(url, session=session) for url in urls]
            return await TensorTransport(trainer, timeout=10).send(clients, 3, flush_cache=False), exporter
    finally:
        await trainer.stop()
        for runner in runners:
            await runner.cleanup()


async def test_an_engine_gone_before_the_sync_is_reported_and_the_other_gets_every_bucket():
    served = _Engine()
    results, trainer = await _sync([None, served])
    assert results[1] is None and isinstance(results[0], EngineUnreachable)
    assert (served.buckets, served.version) == (["bucket-1", "bucket-2"], "3")
    assert trainer.ended == 1


async def test_an_engine_refusing_the_first_bucket_is_reported_with_its_message_and_keeps_its_version():
    refusing, served = _Engine(refuse=1), _Engine()
    results, _ = await _sync([refusing, served])
    assert isinstance(results[0], EngineHTTPError) and "shape mismatch" in str(results[0]) and results[1] is None
    assert (refusing.buckets, refusing.version) == ([], "0")  # the router keeps it out as stale
    assert served.buckets == ["bucket-1", "bucket-2"]


async def test_an_engine_failing_part_way_under_the_new_version_stops_the_sync_naming_it():
    with pytest.raises(WeightSyncError, match=r"failed part-way on engine\(s\) that now report v3 with a mix of old "
                                              r"and new weights: http://127\.0\.0\.1:\d+ \(.*shape mismatch"):
        await _sync([_Engine(), _Engine(refuse=2)])
