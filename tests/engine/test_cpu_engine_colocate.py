"""The CPU engine's side of colocated training (--colocate): SGLang's memory release / resume and
tensor weight updates through real shared-memory handles from this (unrelated) process.

A bad tensor bucket, a payload that does not unpickle and a resume of memory not released end
SGLang 0.5.17's server (actors/engine/cpu/preconditions.py); the tests of the engine's refusals
and of what the run does with them use the refusing engine (`lenient_engine`), the others the
suite's engine, which would exit on such a request.
"""

from __future__ import annotations

import asyncio
import copy
import base64
import pickle
import threading

import pytest
import torch
from safetensors.torch import load_file

from actors.engine.cpu.memory import MemoryOccupation
from actors.engine.cpu.model_runner import ModelRunner
from actors.engine.cpu.protocol import SamplingParams
from actors.engine.cpu.scheduler import REFUSED, Request, Scheduler, SchedulerConfig
from actors.weight_sync.colocate import ColocateError, Colocation
from actors.router.actor import RouterActor
from actors.router.config import RouterConfig
from slime_async.actor import Actor, ActorRef, ActorStopped, spawn
from slime_async.engine_client import EngineClient, EngineHTTPError
from slime_async.weights.tensor_ipc import serialize_named_tensors

PROMPT = [5, 9, 13, 2, 7]


@pytest.fixture
def engine(engine_url, tiny_model_dir):
    """The shared read-only engine (a private one costs seconds of start-up), given back with its
    memory resumed and its own weights and version, whatever a test left."""
    version = asyncio.run(_version(engine_url))
    yield engine_url
    asyncio.run(_restore(engine_url, _weights(tiny_model_dir), version))


@pytest.fixture
def lenient_engine(lenient_engine_url, tiny_model_dir):
    """The shared engine that refuses what SGLang dies on, given back as `engine` is."""
    version = asyncio.run(_version(lenient_engine_url))
    yield lenient_engine_url
    asyncio.run(_restore(lenient_engine_url, _weights(tiny_model_dir), version))


async def _version(url: str) -> str:
    async with EngineClient(url) as client:
        return (await client.get_model_info())["weight_version"]


async def _restore(url: str, weights: dict[str, torch.Tensor], version: str) -> None:
    async with EngineClient(url) as client:
        released = (await _memory(client))["released"]
        if released:
            await client.resume_memory_occupation(released)
        await client.update_weights_from_tensor([serialize_named_tensors(sorted(weights.items()))],
                                                weight_version=version)


def _weights(model_dir, seed: int | None = None) -> dict[str, torch.Tensor]:
    tensors = load_file(str(next(model_dir.glob("*.safetensors"))))
    if seed is None:
        return tensors
    generator = torch.Generator().manual_seed(seed)
    return {name: t + 0.05 * torch.randn(t.shape, generator=generator, dtype=t.dtype) for name, t in tensors.items()}


def _buckets(tensors: dict[str, torch.Tensor], size: int) -> list[list[tuple[str, torch.Tensor]]]:
    items = sorted(tensors.items())
    return [items[i:i + size] for i in range(0, len(items), size)]


async def _logprobs(client: EngineClient) -> list[float]:
    out = await client.generate(PROMPT, {"temperature": 0.0, "max_new_tokens": 4}, return_logprob=True)
    return [entry[0] for entry in out["meta_info"]["output_token_logprobs"]]


async def _memory(client: EngineClient) -> dict:
    return (await client.get_server_info())["memory_occupation"]


async def test_released_memory_is_freed_refuses_generation_and_comes_back_with_the_sent_weights(
        engine, tiny_model_dir, hf_model, recompute_logprobs):
    async with EngineClient(engine) as client:
        before = await _memory(client)
        await client.release_memory_occupation(["weights", "kv_cache"])
        released = await _memory(client)
        assert released["released"] == ["kv_cache", "weights"] and released["weight_bytes"] == 0
        assert before["weight_bytes"] > 0
        with pytest.raises(EngineHTTPError, match="memory is released \\(kv_cache, weights\\)"):
            await _logprobs(client)
        assert not await client.health_generate()
        await client.resume_memory_occupation(["weights"])
        new = _weights(tiny_model_dir, seed=3)
        buckets = _buckets(new, size=4)
        # Resumed but not reloaded: the weights are zeros, and the engine says so instead of serving them.
        await client.update_weights_from_tensor([serialize_named_tensors(buckets[0])], weight_version="7")
        await client.resume_memory_occupation(["kv_cache"])
        with pytest.raises(EngineHTTPError, match="weights are incomplete: .* not loaded since"):
            await _logprobs(client)
        for bucket in buckets[1:]:
            await client.update_weights_from_tensor([serialize_named_tensors(bucket)], weight_version="7")
        served = await client.generate(PROMPT, {"temperature": 0.0, "max_new_tokens": 4}, return_logprob=True)
        assert served["meta_info"]["weight_version"] == "7"
        assert (await _memory(client))["weight_bytes"] == before["weight_bytes"]
    # Exactly the sent weights: the engine's logprobs are those of the new weights, not the old ones.
    model = copy.deepcopy(hf_model)
    model.load_state_dict(new, strict=False)
    tokens = [entry[1] for entry in served["meta_info"]["output_token_logprobs"]]
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + tokens])).logits[0].float()
    expected = torch.log_softmax(logits[len(PROMPT) - 1:-1], -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    got = torch.tensor([entry[0] for entry in served["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, expected, atol=1e-4)
    assert not torch.allclose(got, recompute_logprobs(PROMPT, tokens, 1.0), atol=1e-3)


async def test_a_bad_bucket_is_refused_whole_and_the_engine_keeps_serving_its_weights(lenient_engine, tiny_model_dir):
    async with EngineClient(lenient_engine) as client:
        before = await _logprobs(client)
        good = sorted(_weights(tiny_model_dir, seed=5).items())[:2]
        bad = [*good, ("model.norm.weight", torch.ones(3))]  # a wrong shape after two good tensors
        # SGLang's loader asserts on it, uncaught: its server dies.
        with pytest.raises(EngineHTTPError, match="shape mismatch for 'model.norm.weight'.*server dies"):
            await client.update_weights_from_tensor([serialize_named_tensors(bad)])
        # Nothing of the refused bucket was applied (a prefix-cache hit moves the last float bits).
        assert await _logprobs(client) == pytest.approx(before, abs=1e-5)


class _Shell:
    def __reduce__(self):
        import os

        return os.system, ("true",)


async def test_a_resume_of_memory_not_released_and_payloads_that_are_not_tensor_lists_are_refused(lenient_engine):
    async with EngineClient(lenient_engine) as client:
        with pytest.raises(EngineHTTPError, match="KeyError: 'weights'.*memory not released, cannot resume: weights"):
            await client.resume_memory_occupation(["weights"])
        payload = serialize_named_tensors([("model.norm.weight", torch.ones(64))])
        with pytest.raises(EngineHTTPError, match="one base64 payload per TP rank"):
            await client.update_weights_from_tensor([payload, payload])
        hostile = base64.b64encode(pickle.dumps(_Shell())).decode()
        with pytest.raises(EngineHTTPError, match="references posix.system, which a tensor payload may not"):
            await client.update_weights_from_tensor([hostile])
        # Protocol 4 resolves dotted names: module torch.hub, name os.getpid is os.getpid, so the
        # allow-list must hold exact (module, name) pairs, not module prefixes such as "torch.".
        dotted = base64.b64encode(_protocol4_call("torch.hub", "os.getpid")).decode()
        with pytest.raises(EngineHTTPError, match="references torch.hub.os.getpid, which a tensor payload may not"):
            await client.update_weights_from_tensor([dotted])
        assert (await _memory(client))["released"] == []


def _protocol4_call(module: str, name: str) -> bytes:
    """A pickle that calls module.name() through STACK_GLOBAL (how protocol 4 names globals)."""
    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()
    return b"\x80\x04" + text(module) + text(name) + b"\x93" + b")" + b"R" + b"."


def test_a_request_that_passed_the_early_check_before_a_release_never_runs_on_released_weights(tiny_model_dir):
    """The race of a /generate with a release, made deterministic: the request reaches the
    scheduler only after the release ran there (as when its early check passed just before)."""
    runner = ModelRunner(tiny_model_dir)
    memory = MemoryOccupation(runner)
    scheduler = Scheduler(runner, SchedulerConfig(), refusal=memory.refusal)
    scheduler.start()
    try:
        def control(fn):
            return scheduler.call(fn).result(timeout=30)

        def generate() -> Request:
            done = threading.Event()
            request = Request("r", PROMPT, SamplingParams(temperature=0.0, max_new_tokens=2), False,
                              lambda _req: done.set())
            scheduler.submit(request)
            assert done.wait(30)
            return request

        control(lambda: memory.release(["weights"], scheduler.loads(), scheduler.flush_cache))
        refused = generate()
        assert refused.finish_reason["err_type"] == REFUSED and refused.finish_reason["status_code"] == 503
        assert "memory is released (weights)" in refused.finish_reason["message"]
        control(lambda: memory.resume(["weights"]))
        assert "weights are incomplete" in generate().finish_reason["message"]
        assert scheduler.stats.prompt_tokens == 0  # no prefill ran: the model never saw those weights
        control(lambda: scheduler.swap_weights(_weights(tiny_model_dir), flush_cache=True))
        assert generate().finish_reason["type"] == "length"
    finally:
        scheduler.stop()


# ---- the colocated phases against this engine, with failures injected for real ---------------

class _Trainer(Actor):
    """The trainer's side of the phases for one rank, serving the checkpoint's real tensors as IPC
    handles (bucket ``bad`` gets a wrong shape); the Megatron trainer's own side runs in the e2e run."""

    def __init__(self, weights: dict[str, torch.Tensor], bad: int | None = None):
        super().__init__("trainer")
        self.buckets = _buckets(weights, size=4)
        self.bad, self.sent, self.held = bad, 0, None

    def offload(self, parts) -> float:
        return 0.0

    def onload(self) -> float:
        return 0.0

    def rank_info(self) -> list[int]:
        return [0]

    def next_tensor_bucket(self, serving) -> list[str] | None:
        if self.sent == len(self.buckets):
            return None
        bucket = list(self.buckets[self.sent])
        if self.sent + 1 == self.bad:
            bucket[0] = (bucket[0][0], torch.zeros(3))
        self.sent += 1
        self.held = bucket  # alive until the engines answered, as the ranks hold theirs
        return [serialize_named_tensors(bucket)]

    def end_tensor_export(self) -> None:
        self.held = None

    def memory_peak(self) -> int:
        return 1


@pytest.fixture
async def colocated(tiny_model_dir):
    """``await colocated(engine_url, bad=, idle_wait_s=)``: the run's colocation over a router of that engine."""
    made: list = []

    async def make(url: str, bad: int | None = None, idle_wait_s: float = 60.0) -> tuple[Colocation, ActorRef]:
        router = await spawn(RouterActor(RouterConfig(), [url]))
        trainer = await spawn(_Trainer(_weights(tiny_model_dir, seed=9), bad=bad))
        made.extend([trainer, router])
        return Colocation(trainer, router, timeout=60.0, idle_wait_s=idle_wait_s, release_retry_s=0.0), trainer

    yield make
    for ref in made:
        await ref.stop()


async def test_a_bucket_the_engine_refuses_fails_the_update_and_the_engine_serves_no_half_weights(
        lenient_engine, colocated):
    # (SGLang's server dies on that bucket: the run sees its connection fail instead.)
    colocation, _ = await colocated(lenient_engine, bad=2)
    await colocation.to_trainer()
    async with EngineClient(lenient_engine) as client:
        # Bucket 1 went in under v1's name: the engine must not be taken for one serving v1.
        with pytest.raises(ColocateError, match=rf"update_weights_from_tensor v1 failed part-way on engine\(s\) that "
                                                rf"now report v1 with a mix of old and new weights: {lenient_engine} "
                                                rf"\(.*shape mismatch"):
            await colocation.update_weights([client], version=1)
        with pytest.raises(EngineHTTPError, match="memory is released \\(cuda_graph, kv_cache\\)"):
            await _logprobs(client)  # and with the KV cache resumed: weights incomplete (the test above)


async def test_an_engine_that_refuses_to_resume_fails_the_update_before_any_weight_moves(lenient_engine, colocated):
    # (SGLang's server dies on a resume of memory not released: the run sees its connection fail.)
    colocation, trainer = await colocated(lenient_engine)
    await colocation.to_trainer()
    async with EngineClient(lenient_engine) as client:
        await client.resume_memory_occupation(["weights"])  # behind the run's back: its resume is refused
        with pytest.raises(ColocateError, match="resume_memory_occupation failed on engine.*memory not released"):
            await colocation.update_weights([client], version=1)
        assert trainer.actor.sent == 0
        with pytest.raises(EngineHTTPError, match="memory is released \\(cuda_graph, kv_cache\\)"):
            await _logprobs(client)


async def test_a_trainer_gone_after_the_release_leaves_the_engine_refusing_with_a_clear_error(engine, colocated):
    colocation, trainer = await colocated(engine)
    await colocation.to_trainer()
    await trainer.stop()  # the trainer died while the engines were released
    async with EngineClient(engine) as client:
        with pytest.raises(ActorStopped):
            await colocation.update_weights([client], version=1)
        with pytest.raises(EngineHTTPError, match="memory is released \\(cuda_graph, kv_cache, weights\\)"):
            await _logprobs(client)


async def test_an_engine_that_stays_busy_is_not_released_and_keeps_serving_its_weights(engine, colocated):
    colocation, _ = await colocated(engine, idle_wait_s=0.05)
    async with EngineClient(engine) as client:
        before = await _logprobs(client)
        busy = await _busy(client)
        with pytest.raises(ColocateError, match=r"waiting for idle engines \(flush_cache\) failed .*Timed out"):
            await colocation.to_trainer()
        await busy
        assert await _logprobs(client) == pytest.approx(before, abs=1e-5)


async def _busy(client: EngineClient) -> asyncio.Future:
    """A request the router does not know of (another client's), running once this returns, for
    far longer than the 0.05 s deadlines below (96 tokens took less on this machine)."""
    busy = asyncio.ensure_future(client.generate(PROMPT, {"temperature": 0.0, "max_new_tokens": 900,
                                                          "ignore_eos": True}))
    while not (await client.get_loads())["aggregate"]["total_running_reqs"]:
        await asyncio.sleep(0.01)
    return busy


async def test_a_deferred_flush_answers_once_the_engine_is_idle_or_times_out(engine):
    # SGLang's /flush_cache?timeout=T, the idle barrier colocated training releases memory behind.
    async with EngineClient(engine) as client:
        busy = await _busy(client)
        with pytest.raises(EngineHTTPError, match="Timed out waiting for idle state"):
            await client.flush_cache(wait_idle_s=0.05)
        await client.flush_cache(wait_idle_s=60)
        assert (await client.get_loads())["aggregate"]["total_running_reqs"] == 0
        await busy


async def test_the_release_waits_behind_the_idle_barrier(engine, colocated):
    # SGLang asserts an idle scheduler in a release, and a failed assertion kills the server: the
    # release must never reach a busy engine (this one would exit as SGLang dies).
    colocation, _ = await colocated(engine)
    async with EngineClient(engine) as client:
        busy = await _busy(client)
        await colocation.to_trainer()  # release_retry_s=0: a release sent while busy raises
        await busy
        await client.resume_memory_occupation(["weights", "kv_cache", "cuda_graph"])
