"""slime_async/weights/delta sender <-> receiver over real HTTP on 127.0.0.1: delta when the
receiver holds the sender's base, full otherwise, and a full retry after a checksum mismatch."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
import torch
from aiohttp import web

from slime_async.weights.delta import codec, wire
from slime_async.weights.delta.receiver import DeltaReceiver, LoadRejected, routes
from actors.weight_sync.delta import DeltaSender, DeltaSyncError, Snapshot


class Engine:
    """What the receiver loads into: the last state it was given, by version."""

    def __init__(self) -> None:
        self.loaded: dict[str, dict[str, torch.Tensor]] = {}
        self.flushes: dict[str, bool] = {}  # version -> whether the sender let the engine flush its cache
        self.refuse: str | None = None

    async def load(self, tensors: dict[str, torch.Tensor], version: str, flush_cache: bool) -> str | None:
        if self.refuse:
            raise LoadRejected(self.refuse)
        self.loaded[version] = tensors
        self.flushes[version] = flush_cache
        return None


@contextlib.asynccontextmanager
async def serve(receiver: DeltaReceiver, engine: Engine) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes(routes(receiver, engine.load))
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"embed.weight": (torch.randn(64, 32, generator=generator) * 0.02).to(torch.bfloat16),
            "norm.weight": torch.ones(32),
            "proj.weight": torch.randn(32, 32, generator=generator)}


def _step(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A training step that moves a few weights and leaves the norm alone."""
    moved = {name: tensor.clone() for name, tensor in state.items()}
    moved["embed.weight"][:3] += 0.01
    moved["proj.weight"][0, :5] = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf"), 1.0])
    return moved


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        codec.tensor_bytes(a[n]).tobytes() == codec.tensor_bytes(b[n]).tobytes() for n in a)


@pytest.fixture
def versions() -> list[Snapshot]:
    v1 = _state(0)
    v2 = _step(v1)
    return [Snapshot.of("1", v1), Snapshot.of("2", v2), Snapshot.of("3", _step(v2))]


async def test_the_first_transfer_is_full_and_the_next_a_bit_exact_delta(versions: list[Snapshot]) -> None:
    receiver, engine, sender = DeltaReceiver(), Engine(), DeltaSender()
    v1, v2, _ = versions
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        first = await sender.push(session, url, v1, None)
        second = await sender.push(session, url, v2, v1)
    assert (first.mode, second.mode) == ("full", "delta")
    assert second.wire_bytes < first.wire_bytes / 3
    assert _same_bits(engine.loaded["2"], dict(v2.tensors))
    assert receiver.state() == {"weight_version": "2", "checksum": v2.checksum}


async def test_the_sender_says_whether_the_engine_may_flush_its_prefix_cache(versions: list[Snapshot]) -> None:
    # An engine holding requests in place must not flush (SGLang asserts, and exits, on such a flush).
    engine, sender = Engine(), DeltaSender()
    v1, v2, _ = versions
    async with serve(DeltaReceiver(), engine) as url, aiohttp.ClientSession() as session:
        await sender.push(session, url, v1, None)
        await sender.push(session, url, v2, v1, flush_cache=False)
    assert engine.flushes == {"1": True, "2": False}


async def test_a_restarted_receiver_gets_a_full_transfer(versions: list[Snapshot]) -> None:
    engine, sender = Engine(), DeltaSender()
    v1, v2, v3 = versions
    async with aiohttp.ClientSession() as session:
        async with serve(DeltaReceiver(), engine) as url:
            await sender.push(session, url, v1, None)
            assert (await sender.push(session, url, v2, v1)).mode == "delta"
        async with serve(DeltaReceiver(), engine) as url:  # the engine came back with no base
            after_restart = await sender.push(session, url, v3, v2)
    assert (after_restart.mode, after_restart.fallback) == ("full", None)
    assert _same_bits(engine.loaded["3"], dict(v3.tensors))


async def test_a_checksum_mismatch_falls_back_to_a_full_transfer(versions: list[Snapshot]) -> None:
    receiver, engine, sender = DeltaReceiver(), Engine(), DeltaSender()
    v1, v2, _ = versions
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        await sender.push(session, url, v1, None)
        # The receiver's copy rots (a bit flips in memory): it still reports v1's checksum.
        rotten = receiver.tensors["proj.weight"].clone()
        rotten.reshape(-1).view(torch.uint8)[7] ^= 0x01
        receiver.tensors = {**receiver.tensors, "proj.weight": rotten}
        result = await sender.push(session, url, v2, v1)
    assert (result.mode, result.fallback) == ("full", "checksum_mismatch")
    assert _same_bits(engine.loaded["2"], dict(v2.tensors))
    assert receiver.state()["checksum"] == v2.checksum


async def test_a_delta_against_a_base_the_receiver_does_not_hold_is_refused(versions: list[Snapshot]) -> None:
    receiver, engine, sender = DeltaReceiver(), Engine(), DeltaSender()
    v1, v2, v3 = versions
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        await sender.push(session, url, v1, None)
        status, answer, _ = await sender._post(session, url, v3, v2, None, 30.0, True)
    assert (status, answer["reason"]) == (409, "base_mismatch")
    assert receiver.state()["weight_version"] == "1" and "3" not in engine.loaded


async def test_weights_the_engine_refuses_leave_the_receiver_on_its_version(versions: list[Snapshot]) -> None:
    receiver, engine, sender = DeltaReceiver(), Engine(), DeltaSender()
    v1, v2, _ = versions
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        await sender.push(session, url, v1, None)
        engine.refuse = "shape mismatch for 'proj.weight'"
        with pytest.raises(DeltaSyncError, match=rf"weight delta to {url} failed \(400\): shape mismatch"):
            await sender.push(session, url, v2, v1)
    assert receiver.state() == {"weight_version": "1", "checksum": v1.checksum}


async def test_a_truncated_stream_changes_nothing(versions: list[Snapshot]) -> None:
    receiver, engine = DeltaReceiver(), Engine()
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        body = wire.preamble() + wire.frame({"kind": "begin", "mode": "full", "weight_version": "1", "count": 3})
        async with session.post(url + wire.UPDATE_PATH, data=body) as response:
            answer = await response.json()
    assert (response.status, answer["reason"]) == (400, "corrupt")
    assert receiver.state()["weight_version"] is None and not engine.loaded


async def test_a_begin_frame_without_its_version_is_refused_as_corrupt() -> None:
    receiver, engine = DeltaReceiver(), Engine()
    async with serve(receiver, engine) as url, aiohttp.ClientSession() as session:
        body = wire.preamble() + wire.frame({"kind": "begin", "mode": "full", "count": 0}) + wire.frame({"kind": "end"})
        async with session.post(url + wire.UPDATE_PATH, data=body) as response:
            answer = await response.json()
    assert (response.status, answer["reason"]) == (400, "corrupt")
    assert "weight_version" in answer["message"] and not engine.loaded
