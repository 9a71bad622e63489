"""The tensor transport's start check: IPC handles only reach engines on the trainer's own devices."""

import pytest

from actors.weight_sync.errors import WeightSyncError
from actors.weight_sync.tensor import TensorTransport
from slime_async.actor import Actor, spawn
from slime_async.engine_client import EngineClient


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

