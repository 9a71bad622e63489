"""Ranks of the weight-update group: trainer rank 0, then every TP worker of every engine."""

import pytest

from actors.loop.run_config import parse_run_config
from actors.weight_sync.actor import WeightSyncActor
from actors.weight_sync.distributed import broadcast_layout
from actors.weight_sync.errors import WeightSyncError
from slime_async.actor import Actor, spawn
from slime_async.config.flags import ConfigError
from slime_async.net import free_port


def test_each_engine_takes_as_many_ranks_as_it_has_tp_workers():
    infos = [{"tp_size": 2}, {"tp_size": 1}, {"tp_size": 4}]
    assert broadcast_layout(["a", "b", "c"], infos) == ([1, 3, 4], 8)


def test_an_engine_that_does_not_report_its_tp_size_takes_one_rank():
    assert broadcast_layout(["cpu", "old"], [{"tp_size": 1}, {}]) == ([1, 2], 3)


@pytest.mark.parametrize("field", ["dp_size", "pp_size"])
def test_an_engine_with_dp_or_pp_is_refused_naming_it_and_the_way_out(field):
    with pytest.raises(WeightSyncError, match=rf"engine http://e1 runs with {field}=2: .*--update-weight-transport disk"):
        broadcast_layout(["http://e0", "http://e1"], [{"tp_size": 1}, {"tp_size": 1, field: 2}])


class _Router(Actor):
    """The router's side of a sync: one engine it last saw healthy, and the resume it is told."""

    def __init__(self, url: str):
        super().__init__("router")
        self.url = url
        self.resumed: list[str] = []

    async def pause(self, mode: str) -> None:
        pass

    async def engines(self) -> list[dict]:
        return [{"url": self.url, "health": "up", "paused": True}]

    async def resume(self, version: str) -> dict[str, str]:
        self.resumed.append(version)
        return {self.url: "stale"}


class _Trainer(Actor):
    """A trainer that must not be asked: nobody is there to receive the weights."""

    def __init__(self):
        super().__init__("trainer")
        self.asked = 0

    async def init_weight_group(self, *args, **kwargs) -> None:
        self.asked += 1


async def test_a_distributed_sync_whose_only_engine_died_since_the_last_health_check_goes_on(tmp_path):
    # Killed between the router's health check and the sync (the chaos run's kill -9 lands there
    # at times): the sync logs it and resumes, the router keeps the engine out as stale, and the
    # watcher updates it once its restart answers. It used to end the run with EngineUnreachable.
    router, trainer = await spawn(_Router(f"http://127.0.0.1:{free_port()}")), await spawn(_Trainer())
    sync = await spawn(WeightSyncActor(trainer, router, "distributed", "abort", tmp_path))
    try:
        await sync.ask("sync", 3)
    finally:
        await sync.stop()
        await router.stop()
        await trainer.stop()
    assert router.actor.resumed == ["3"] and trainer.actor.asked == 0


@pytest.mark.parametrize(("flag", "value"), [("--update-weight-transport", "nccl"), ("--weight-update-mode", "flush")])
def test_a_transport_or_mode_the_sync_does_not_know_fails_at_parse_naming_the_flag(flag, value):
    with pytest.raises(ConfigError, match=rf"{flag}.*{value}"):
        parse_run_config(["--prompt-data", "p.jsonl", "--hf-checkpoint", "m", flag, value])
