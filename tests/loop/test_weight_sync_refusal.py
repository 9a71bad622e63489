"""An engine that refuses the weights, at the weight sync's level: real CPU engines on loopback, a real
router, the disk transport. The refusing engine serves another model than the trainer's (other shapes:
its loader refuses the checkpoint with ``success: false``, as SGLang's does and rolls back)."""

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from actors.router import RouterActor, RouterConfig
from actors.weight_sync.actor import WeightSyncActor
from actors.weight_sync.errors import NoEngineTakesWeights
from actors.weight_sync.refusals import ATTEMPTS, Refusals, backoff
from actors.engine.cpu.local import start_local_engine, stop_local_engine
from examples.models.tiny import build_tiny_model
from slime_async.actor import Actor, ActorFailed, spawn


class _Trainer(Actor):
    """The trainer's export, as its files: the HF checkpoint the run started from (the trainer's model)."""

    def __init__(self, model: Path):
        super().__init__("trainer")
        self.model = model

    async def export_hf(self, path: str) -> None:
        shutil.copytree(self.model, path, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """The trainer's model, and one with the same vocabulary but half the width."""
    root = tmp_path_factory.mktemp("refusal-models")
    return (build_tiny_model(root / "policy", arch="qwen2", seed=0),
            build_tiny_model(root / "other", arch="qwen2", hidden_size=32, seed=0))


@contextlib.contextmanager
def engines(tmp_path: Path, *models: Path) -> Iterator[list[str]]:
    started = []
    try:
        for index, model in enumerate(models):
            started.append(start_local_engine(model, tmp_path / f"engine-{index}.log", "--num-threads", "1"))
        yield [url for _, url in started]
    finally:
        for process, _ in started:
            stop_local_engine(process)


@contextlib.asynccontextmanager
async def weight_sync(urls: list[str], model: Path, weights: Path, health_interval: float = 3600.0):
    # The watcher every 0.1 s, so that the refused engine's retries (after 1 s, then 2 s) come soon.
    router = await spawn(RouterActor(RouterConfig(router_health_interval=health_interval, router_load_interval=0.0),
                                     urls))
    trainer = await spawn(_Trainer(model))
    sync = await spawn(WeightSyncActor(trainer, router, "disk", "abort", weights, watch_interval=0.1))
    try:
        yield router, sync
    finally:
        await sync.stop()
        await router.stop()
        await trainer.stop()


async def wait_for(predicate, what: str, timeout: float = 60.0):
    """Poll ``predicate`` (a coroutine function) until it holds; fail naming ``what`` after ``timeout`` s."""
    async with asyncio.timeout(timeout):
        while not (value := await predicate()):
            await asyncio.sleep(0.05)
    return value


async def test_one_engine_of_two_refusing_keeps_the_run_going_and_is_tried_again_at_the_next_version(
        tmp_path, models):
    policy, other = models
    with engines(tmp_path, policy, other) as (good, refusing):
        async with weight_sync([good, refusing], policy, tmp_path / "weights") as (router, sync):
            await sync.ask("sync", 1, timeout=None)  # returns: the other engine serves v1
            states = {e["url"]: e for e in await router.ask("engines")}
            assert states[good]["state"] == "up" and states[refusing]["state"] == "stale"
            # The watcher retries it after a backoff, then leaves it out until the next version.
            metrics = await wait_for(lambda: _metrics_when(sync, lambda m: m["perf/weight_sync_engines_refusing"] == 1),
                                     "the refusing engine given up on at v1")
            assert metrics["perf/weight_sync_refusals"] == ATTEMPTS
            # Requests go to the engine that took v1.
            answer = await router.ask("generate", [1, 2, 3], {"max_new_tokens": 2, "temperature": 0}, timeout=60)
            assert answer["engine_url"] == good and answer["meta_info"]["weight_version"] == "1"
            # The next version is tried on it again, once more refused: counted, and the sync goes on.
            await sync.ask("sync", 2, timeout=None)
            metrics = await sync.ask("metrics")
            assert metrics["perf/weight_sync_refusals"] == ATTEMPTS + 1
            assert metrics["perf/weight_sync_engines_refusing"] == 0  # tries left at v2


async def _metrics_when(sync, condition):
    metrics = await sync.ask("metrics")
    return metrics if condition(metrics) else None


async def test_a_sync_whose_every_engine_refuses_fails_naming_the_engine_and_its_refusal(tmp_path, models, caplog):
    policy, other = models
    with engines(tmp_path, other) as (refusing,):
        async with weight_sync([refusing], policy, tmp_path / "weights") as (_, sync):
            with pytest.raises(NoEngineTakesWeights) as raised:
                await sync.ask("sync", 1, timeout=None)
    message = str(raised.value)
    assert message.startswith("weight sync v1: no engine can serve the new weights")
    assert f"{refusing} refused it {ATTEMPTS} time(s)" in message
    assert "shape mismatch for 'lm_head.weight': got [512, 64], model has [512, 32]" in message
    refusals = [r.getMessage() for r in caplog.records if "refused the weights" in r.getMessage()]
    assert len(refusals) == ATTEMPTS and "try 3 of 3; kept out until the next version" in refusals[-1]


async def test_an_only_engine_restarted_with_another_model_ends_the_weight_sync_naming_its_refusal(tmp_path, models):
    # Between syncs: the external engine is restarted on its port serving another model. The router
    # finds it healthy with other weights (stale), the watcher loads the current ones into it, it
    # refuses them 3 times, and nothing else could generate: the actor fails (and with it the run).
    policy, other = models
    process, url = start_local_engine(policy, tmp_path / "engine.log", "--num-threads", "1")
    try:
        async with weight_sync([url], policy, tmp_path / "weights", health_interval=0.2) as (_, sync):
            await sync.ask("sync", 1, timeout=None)
            stop_local_engine(process)
            port = url.rsplit(":", 1)[1]
            process, _ = start_local_engine(other, tmp_path / "engine-again.log", "--num-threads", "1", "--port", port)
            with pytest.raises(ActorFailed) as raised:
                async with asyncio.timeout(120):  # a hang guard only
                    await sync.wait()
    finally:
        stop_local_engine(process)
    error = raised.value.error
    assert isinstance(error, NoEngineTakesWeights)
    assert f"weight sync v1: no engine can serve the new weights, every one refused them: {url} refused it 3 time(s)" \
        in str(error) and "shape mismatch" in str(error)


def test_refusals_are_tried_after_a_doubling_backoff_and_given_up_on_after_the_last_try():
    refusals = Refusals()
    assert refusals.due("e", 1, now=0.0)  # never refused
    assert refusals.record("e", 1, "no", now=10.0) == 1
    assert not refusals.due("e", 1, now=10.5) and refusals.due("e", 1, now=11.0)  # 1 s
    assert refusals.wait("e", 1, now=10.25) == 0.75
    assert refusals.record("e", 1, "no", now=11.0) == 2
    assert backoff(2) == 2.0 and not refusals.due("e", 1, now=12.5) and refusals.due("e", 1, now=13.0)
    assert refusals.record("e", 1, "no", now=13.0) == 3
    assert refusals.exhausted("e", 1) and not refusals.due("e", 1, now=1e9)
    assert refusals.holding_out(1) == 1 and refusals.describe(["e"], 1) == "e refused it 3 time(s): no"
    assert refusals.due("e", 2, now=13.0) and refusals.record("e", 2, "no", now=13.0) == 1  # a new version: tried again
    refusals.accepted("e")
    assert not refusals.refused("e", 2) and refusals.total == 4
