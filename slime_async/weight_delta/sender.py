"""The trainer-side end of delta weight sync: stream one version to one receiver (wire.py).

``Snapshot`` is a version's tensors with their checksums. ``DeltaSender.push`` asks the
receiver which version it holds, streams a delta against the sender's base where the receiver
holds exactly that base (version and checksum), a full transfer otherwise, and falls back to a
full transfer when the receiver answers base_mismatch or checksum_mismatch. Each tensor's
payload is encoded once per (version, base) and shared by every receiver on that base.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import torch

from slime_async.weight_delta import codec, wire


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
                   headers: Mapping[str, str] | None = None, timeout: float | None = 300.0) -> PushResult:
        """Bring the receiver at ``url`` to ``target``; raises DeltaSyncError naming ``url``."""
        started = time.monotonic()
        state = await self.receiver_state(session, url, headers, timeout)
        holds_base = (base is not None and state.get("weight_version") == base.version
                      and state.get("checksum") == base.checksum)
        sent = 0
        fallback = None
        if holds_base:
            status, answer, nbytes = await self._post(session, url, target, base, headers, timeout)
            sent += nbytes
            if status == 200:
                return PushResult(url, "delta", sent, _raw_bytes(target), time.monotonic() - started,
                                  served_checksum=_confirmed(url, target, answer))
            if answer.get("reason") not in ("base_mismatch", "checksum_mismatch"):
                raise DeltaSyncError(f"weight delta to {url} failed ({status}): {answer.get('message')}")
            fallback = str(answer.get("reason"))
        status, answer, nbytes = await self._post(session, url, target, None, headers, timeout)
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
                    headers: Mapping[str, str] | None, timeout: float | None) -> tuple[int, dict[str, Any], int]:
        counter = [0]
        body = self._stream(target, base, counter)
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

    async def _stream(self, target: Snapshot, base: Snapshot | None, counter: list[int]) -> AsyncIterator[bytes]:
        begin = {"kind": "begin", "mode": "delta" if base is not None else "full",
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
            cache[name] = asyncio.ensure_future(asyncio.to_thread(self._encode, target, base, name))
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
