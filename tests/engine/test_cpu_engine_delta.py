"""The CPU engine's delta weight updates (/weights_delta/*, slime_async/weights/delta/wire.py):
what it serves after a full and after a delta transfer is the sent state, bit for bit; and the
receiver that sits beside an SGLang engine (actors/engine/delta_receiver.py), here in front of
the CPU engine's SGLang-compatible /update_weights_from_disk.

They use the shared engine and put its original weights and version back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import torch

from actors.engine.config import EngineConfig
from actors.engine.fleet import delta_receiver_spec
from slime_async.net import free_port
from slime_async.weights.delta import wire
from actors.weight_sync.delta import DeltaSender, DeltaSyncError, Snapshot

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def delta_engine_url(engine_url: str, tiny_model_dir: Path, http: aiohttp.ClientSession) -> AsyncIterator[str]:
    """The shared engine; afterwards it serves the original weights as version "default" again."""
    yield engine_url
    restore = {"model_path": str(tiny_model_dir), "weight_version": "default"}
    async with http.post(engine_url + "/update_weights_from_disk", json=restore) as response:
        assert response.status == 200, await response.text()


async def served_state(http: aiohttp.ClientSession, url: str) -> dict:
    async with http.get(url + wire.STATE_PATH, params={"served": "1"}) as response:
        assert response.status == 200
        return await response.json()


async def weight_version(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url + "/get_weight_version") as response:
        return (await response.json())["weight_version"]


def stepped(snapshot: Snapshot, version: str) -> Snapshot:
    tensors = {name: tensor.clone() for name, tensor in snapshot.tensors.items()}
    first = next(iter(tensors))
    tensors[first].reshape(-1)[:7] += 1e-3
    tensors[first].reshape(-1)[7] = -0.0
    return Snapshot.of(version, tensors)


async def test_the_engine_serves_a_full_then_a_delta_transfer_bit_for_bit(
        delta_engine_url: str, other_weights_dir: Path, http: aiohttp.ClientSession) -> None:
    v1 = Snapshot.from_hf_dir("1", other_weights_dir)
    v2 = stepped(v1, "2")
    sender = DeltaSender()
    first = await sender.push(http, delta_engine_url, v1, None)
    assert (await served_state(http, delta_engine_url))["served_checksum"] == v1.checksum
    second = await sender.push(http, delta_engine_url, v2, v1)
    state = await served_state(http, delta_engine_url)
    assert (first.mode, second.mode) == ("full", "delta")
    assert (first.served_checksum, second.served_checksum) == (v1.checksum, v2.checksum)  # the engine's own check
    assert state == {"weight_version": "2", "checksum": v2.checksum, "served_checksum": v2.checksum}
    assert await weight_version(http, delta_engine_url) == "2"
    assert second.wire_bytes < first.wire_bytes / 10


async def test_weights_of_the_wrong_shape_are_refused_and_the_old_ones_keep_serving(
        delta_engine_url: str, other_weights_dir: Path, http: aiohttp.ClientSession) -> None:
    v1 = Snapshot.from_hf_dir("1", other_weights_dir)
    sender = DeltaSender()
    await sender.push(http, delta_engine_url, v1, None)
    name = next(iter(v1.tensors))
    wrong = Snapshot.of("2", {**v1.tensors, name: torch.zeros(3, 3)})
    with pytest.raises(DeltaSyncError, match=rf"failed \(400\): .*shape mismatch for {name!r}"):
        await sender.push(http, delta_engine_url, wrong, v1)
    assert (await served_state(http, delta_engine_url))["served_checksum"] == v1.checksum
    assert await weight_version(http, delta_engine_url) == "1"


@contextlib.contextmanager
def sidecar_receiver(engine_url: str, model_dir: Path, root: Path) -> Iterator[str]:
    """`python -m actors.engine.delta_receiver` in front of ``engine_url`` (which the CPU engine
    serves with SGLang's /update_weights_from_disk); yields its URL."""
    log_path = root / "receiver.log"
    # What the fleet starts beside an owned SGLang engine (here at a free port, as the fleet picks one).
    spec = delta_receiver_spec("delta-receiver-0", engine_url, str(model_dir), "127.0.0.1", free_port(),
                               root / "versions", EngineConfig())
    with open(log_path, "wb") as log:
        process = subprocess.Popen(spec.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                   env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"listening on (http://\S+)", log_path.read_text())):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        yield match.group(1)
    finally:
        process.terminate()
        process.wait(timeout=15)


async def test_the_receiver_beside_an_engine_loads_each_version_through_its_disk_api(
        delta_engine_url: str, other_weights_dir: Path, tmp_path: Path, http: aiohttp.ClientSession) -> None:
    v1 = Snapshot.from_hf_dir("1", other_weights_dir)
    v2, v3 = stepped(v1, "2"), stepped(stepped(v1, "2"), "3")
    await DeltaSender().push(http, delta_engine_url, v1, None)  # names the engine's own served checksum
    sender = DeltaSender()
    with sidecar_receiver(delta_engine_url, other_weights_dir, tmp_path) as receiver_url:
        modes = [(await sender.push(http, receiver_url, v2, None)).mode,
                 (await sender.push(http, receiver_url, v3, v2)).mode]
        assert (await sender.receiver_state(http, receiver_url))["checksum"] == v3.checksum
    assert modes == ["full", "delta"]
    assert await weight_version(http, delta_engine_url) == "3"
    assert (await served_state(http, delta_engine_url))["served_checksum"] == v3.checksum
    assert sorted(p.name for p in (tmp_path / "versions").iterdir()) == ["v2", "v3"]
    assert (tmp_path / "versions" / "v3" / "config.json").is_file()
