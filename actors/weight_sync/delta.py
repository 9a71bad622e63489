"""The delta transport: stream one version to each engine's receiver (slime_async/weights/delta/wire.py).

``Snapshot`` is a version's tensors with their checksums. ``DeltaSender.push`` asks the
receiver which version it holds, streams a delta against the sender's base where the receiver
holds exactly that base (version and checksum), a full transfer otherwise, and falls back to a
full transfer when the receiver answers base_mismatch or checksum_mismatch. Each tensor's
payload is encoded once per (version, base) and shared by every receiver on that base.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import torch

from actors.weight_sync.disk import DiskTransport
from actors.weight_sync.errors import WeightSyncError
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient
from slime_async.task_group import gather_settled
from slime_async.weights.delta import codec, wire

log = logging.getLogger(__name__)


class DeltaSyncError(RuntimeError):
    """A receiver that could not be brought to the version; the message names its URL."""


@dataclass(frozen=True)
class Snapshot:
    version: str
    tensors: Mapping[str, torch.Tensor]
    metas: Mapping[str, codec.TensorMeta]
    checksum: str

    @classmethod
    def of(cls, version: str, tensors: Mapping[str, torch.Tensor]) -> Snapshot:
        """Checksums every tensor (CPU-bound: call it in a thread)."""
        tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
        metas = codec.state_metas(tensors)
        return cls(version, tensors, metas, codec.state_checksum(metas.values()))

    @classmethod
    def from_hf_dir(cls, version: str, path: str | Path) -> Snapshot:
        """The tensors of an HF safetensors export (what the disk transport writes)."""
        from safetensors.torch import load_file

        tensors: dict[str, torch.Tensor] = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            tensors.update(load_file(str(file)))
        if not tensors:
            raise DeltaSyncError(f"no *.safetensors tensors in {path}")
        return cls.of(version, tensors)


@dataclass(frozen=True)
class PushResult:
    url: str
    mode: str  # delta | full
    wire_bytes: int  # the request bodies streamed (the fallback's included)
    full_bytes: int  # the raw bytes of the version's tensors, for comparison
    seconds: float
    fallback: str | None = None  # why a delta became a full transfer
    served_checksum: str | None = None  # the engine's own check of what it serves, where it can tell


class DeltaSender:
    def __init__(self, level: int = codec.ZSTD_LEVEL) -> None:
        self.level = level
        self._encoded: dict[tuple[str, str | None], dict[str, asyncio.Future]] = {}

    def forget(self, keep: str) -> None:
        """Drop the encodings of every version but ``keep``."""
        self._encoded = {key: value for key, value in self._encoded.items() if key[0] == keep}

    async def push(self, session: aiohttp.ClientSession, url: str, target: Snapshot, base: Snapshot | None, *,
                   headers: Mapping[str, str] | None = None, timeout: float | None = 300.0,
                   flush_cache: bool = True) -> PushResult:
        """Bring the receiver at ``url`` to ``target``; raises DeltaSyncError naming ``url``."""
        started = time.monotonic()
        state = await self.receiver_state(session, url, headers, timeout)
        holds_base = (base is not None and state.get("weight_version") == base.version
                      and state.get("checksum") == base.checksum)
        sent = 0
        fallback = None
        if holds_base:
            status, answer, nbytes = await self._post(session, url, target, base, headers, timeout, flush_cache)
            sent += nbytes
            if status == 200:
                return PushResult(url, "delta", sent, _raw_bytes(target), time.monotonic() - started,
                                  served_checksum=_confirmed(url, target, answer))
            if answer.get("reason") not in ("base_mismatch", "checksum_mismatch"):
                raise DeltaSyncError(f"weight delta to {url} failed ({status}): {answer.get('message')}")
            fallback = str(answer.get("reason"))
        status, answer, nbytes = await self._post(session, url, target, None, headers, timeout, flush_cache)
        sent += nbytes
        if status != 200:
            raise DeltaSyncError(f"full weight transfer to {url} failed ({status}): {answer.get('message')}")
        return PushResult(url, "full", sent, _raw_bytes(target), time.monotonic() - started, fallback,
                          _confirmed(url, target, answer))

    async def receiver_state(self, session: aiohttp.ClientSession, url: str,
                             headers: Mapping[str, str] | None = None, timeout: float | None = 30.0) -> dict[str, Any]:
        """The receiver's ``/weights_delta/state``; raises DeltaSyncError naming ``url``."""
        try:
            async with session.get(url + wire.STATE_PATH, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                body = await response.read()
                if response.status != 200:
                    raise DeltaSyncError(f"{url}{wire.STATE_PATH} answered {response.status}: "
                                         f"{body[:200]!r} (does it serve delta weight updates?)")
                return orjson.loads(body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeltaSyncError(f"cannot reach the weight-delta receiver at {url}: {exc!r}") from exc

    async def _post(self, session: aiohttp.ClientSession, url: str, target: Snapshot, base: Snapshot | None,
                    headers: Mapping[str, str] | None, timeout: float | None,
                    flush_cache: bool) -> tuple[int, dict[str, Any], int]:
        counter = [0]
        body = self._stream(target, base, counter, flush_cache)
        try:
            async with session.post(url + wire.UPDATE_PATH, data=body,
                                    headers={**(headers or {}), "Content-Type": wire.CONTENT_TYPE},
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                raw = await response.read()
                try:
                    answer = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    answer = {"message": raw[:200].decode(errors="replace")}
                return response.status, answer, counter[0]
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DeltaSyncError(f"weight transfer to {url} broke off: {exc!r}") from exc

    async def _stream(self, target: Snapshot, base: Snapshot | None, counter: list[int],
                      flush_cache: bool) -> AsyncIterator[bytes]:
        begin = {"flush_cache": flush_cache, "kind": "begin", "mode": "delta" if base is not None else "full",
                 "base_version": base.version if base else None, "base_checksum": base.checksum if base else None,
                 "weight_version": target.version, "count": len(target.tensors), "checksum": target.checksum}
        for chunk in (wire.preamble(), wire.frame(begin)):
            counter[0] += len(chunk)
            yield chunk
        names = list(target.tensors)
        for i, name in enumerate(names):
            for ahead in names[i + 1:i + 3]:  # encode the next tensors while this one is on the wire
                self._frame(target, base, ahead)
            chunk = await self._frame(target, base, name)
            counter[0] += len(chunk)
            yield chunk
        end = wire.frame({"kind": "end"})
        counter[0] += len(end)
        yield end

    def _frame(self, target: Snapshot, base: Snapshot | None, name: str) -> asyncio.Future:
        cache = self._encoded.setdefault((target.version, base.version if base else None), {})
        if name not in cache:
            # An executor future, not a task: nothing to cancel when ``forget`` drops it (a thread runs to its end).
            cache[name] = asyncio.get_running_loop().run_in_executor(None, self._encode, target, base, name)
        return cache[name]

    def _encode(self, target: Snapshot, base: Snapshot | None, name: str) -> bytes:
        meta = target.metas[name]
        raw = codec.tensor_bytes(target.tensors[name])
        base_raw = None
        if base is not None:
            base_meta = base.metas.get(name)
            if base_meta is not None and (base_meta.dtype, base_meta.shape) == (meta.dtype, meta.shape):
                base_raw = codec.tensor_bytes(base.tensors[name])
        encoding, payload = codec.encode(raw, meta.itemsize, base_raw, self.level)
        header = {"kind": "tensor", "name": name, "dtype": meta.dtype, "shape": list(meta.shape),
                  "checksum": meta.checksum, "encoding": encoding}
        return wire.frame(header, payload)


def _confirmed(url: str, target: Snapshot, answer: Mapping[str, Any]) -> str | None:
    """The engine's served checksum; raises if the receiver or the engine holds other bits than sent."""
    for key in ("checksum", "served_checksum"):
        if answer.get(key) not in (None, target.checksum):
            raise DeltaSyncError(f"{url} loaded v{target.version} but reports {key} {answer[key]}, "
                                 f"not the sent {target.checksum}")
    return answer.get("served_checksum")


def _raw_bytes(snapshot: Snapshot) -> int:
    return sum(meta.nbytes for meta in snapshot.metas.values())


class DeltaTransport:
    """Each engine's receiver gets the XOR of the new weights against the version it holds.

    The supervisor holds this version and the last one (2x the weights) while it sends. A
    receiver is the engine itself (the CPU engine) or a ``delta_receiver`` beside it (SGLang),
    which loads what it received from disk (``flush_cache`` is its concern, told per push).
    """

    def __init__(self, trainer: ActorRef, weights_dir: Path, receivers: Mapping[str, str], *,
                 timeout: float | None = 300.0, api_key: str | None = None) -> None:
        self.disk = DiskTransport(trainer, weights_dir, timeout=timeout)
        self.receivers = dict(receivers)  # engine URL -> its receiver's URL; unnamed: its own
        self.timeout = timeout
        self.api_key = api_key
        self._sender = DeltaSender()
        self._base: Snapshot | None = None  # the last version sent: what a delta is computed against
        self._results: list[PushResult] = []  # the transfers of the last sync or rejoin

    async def check(self, clients: Sequence[EngineClient]) -> None:
        async with aiohttp.ClientSession() as session:
            results = await gather_settled(*(self._sender.receiver_state(session, self._receiver(c.url), timeout=30.0)
                                             for c in clients))
        for client, result in zip(clients, results):
            if isinstance(result, BaseException):
                raise WeightSyncError(
                    f"--update-weight-transport delta: engine {client.url} has no weight-delta receiver ({result}); "
                    "the CPU engine is its own, an SGLang engine needs `python -m actors.engine.delta_receiver` "
                    "beside it, named in --update-weight-delta-receivers ENGINE_URL=RECEIVER_URL")

    async def send(self, clients: Sequence[EngineClient], version: int, *, flush_cache: bool) -> list[object]:
        path = await self.disk.export(version)
        target = await asyncio.to_thread(Snapshot.from_hf_dir, str(version), path)
        results = await self._push(clients, target, flush_cache=flush_cache)
        self._base = target
        self._sender.forget(keep=target.version)
        self.disk.prune(version)
        return results

    async def rejoin(self, client: EngineClient, version: int) -> list[object]:
        # The version last sent; a restarted engine's receiver holds none: a full transfer.
        return await self._push([client], self._base, flush_cache=False)

    async def _push(self, clients: Sequence[EngineClient], target: Snapshot | None, *,
                    flush_cache: bool) -> list[object]:
        if target is None:
            raise WeightSyncError("delta transport: no version has been exported yet")
        base = self._base
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        async with aiohttp.ClientSession() as session:
            results = await gather_settled(*(
                self._sender.push(session, self._receiver(c.url), target, base, headers=headers, timeout=self.timeout,
                                  flush_cache=flush_cache)
                for c in clients))
        self._results = [r for r in results if isinstance(r, PushResult)]
        for result in self._results:
            log.info("weight sync v%s -> %s: %s transfer, %d bytes on the wire for %d bytes of weights, %.2f s%s%s",
                     target.version, result.url, result.mode, result.wire_bytes, result.full_bytes, result.seconds,
                     f" (the delta failed: {result.fallback})" if result.fallback else "",
                     f", served checksum {result.served_checksum}" if result.served_checksum else "")
        return results

    def _receiver(self, engine_url: str) -> str:
        return self.receivers.get(engine_url, engine_url).rstrip("/")

    @property
    def results(self) -> list[PushResult]:
        """Each engine's transfer in the last sync or rejoin (mode, bytes, seconds)."""
        return list(self._results)

    def metrics(self) -> dict[str, float]:
        """The last transfer's bytes on the wire (all engines), their share of a full transfer's, and
        how many engines got a full one (no transfer at all when every engine was gone: no ratio)."""
        wire_bytes = sum(r.wire_bytes for r in self._results)
        full = sum(r.full_bytes for r in self._results)
        out = {"perf/weight_sync_wire_bytes": float(wire_bytes),
               "perf/weight_sync_full_transfers": float(sum(r.mode == "full" for r in self._results))}
        if full:
            out["perf/weight_sync_wire_ratio"] = wire_bytes / full
        return out

    async def close(self) -> None:
        pass
