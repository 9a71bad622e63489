"""The engine-side end of delta weight sync: keeps the tensors of the version the engine serves,
rebuilds the next version from a stream (wire.py), checks it, and hands it to the engine.

One ``DeltaReceiver`` per engine. The CPU engine mounts its routes itself; beside SGLang,
``actors.engine.delta_receiver`` does, loading through SGLang's ``/update_weights_from_disk``.
The base is replaced only after the engine took the new weights, so a failed load leaves the
receiver and the engine on the same (old) version.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch
from aiohttp import web

from slime_async.weights.delta import codec, wire

log = logging.getLogger(__name__)

# Loads a checked state into the engine; raises LoadRejected when the engine refuses it. Returns the
# checksum of what the engine then serves under those names where it can tell (its tensors at hand,
# in the sent dtypes), else None: the sender then knows the engine's weights, not only the
# receiver's copy, are the sent bits.
Loader = Callable[[dict[str, torch.Tensor], str, bool], Awaitable[str | None]]  # tensors, version, flush_cache
ServedChecksum = Callable[[list[str]], Awaitable[str]]


class LoadRejected(RuntimeError):
    """The engine refused the reconstructed weights (names, shapes); the message says why."""


class BaseMismatch(RuntimeError):
    pass


@dataclass
class Received:
    version: str
    tensors: dict[str, torch.Tensor]
    metas: dict[str, codec.TensorMeta]
    checksum: str
    mode: str
    wire_bytes: int
    flush_cache: bool = True  # the sender's word: may the engine flush its prefix cache (is it idle)?


@dataclass
class DeltaReceiver:
    version: str | None = None
    checksum: str | None = None
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metas: dict[str, codec.TensorMeta] = field(default_factory=dict)
    # One update at a time: each rebuilds against the base the previous one leaves.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    def state(self) -> dict[str, str | None]:
        return {"weight_version": self.version, "checksum": self.checksum}

    def drop_base(self) -> None:
        self.version, self.checksum, self.tensors, self.metas = None, None, {}, {}

    def commit(self, received: Received) -> None:
        self.version, self.checksum = received.version, received.checksum
        self.tensors, self.metas = received.tensors, received.metas

    async def receive(self, read_exactly: Callable[[int], Awaitable[bytes]]) -> Received:
        """Rebuild the streamed version; raises BaseMismatch, wire.WireError or
        codec.DeltaDecodeError (checksums included). Nothing is changed here."""
        wire_bytes = 0

        async def counted(n: int) -> bytes:
            nonlocal wire_bytes
            data = await read_exactly(n)
            wire_bytes += len(data)
            return data

        frames = wire.read_frames(counted)
        begin, _ = await anext(frames)
        if begin.get("kind") != "begin":
            raise wire.WireError(f"first frame is {begin.get('kind')!r}, expected 'begin'")
        mode = begin.get("mode")
        if mode == "delta" and (begin.get("base_version") != self.version or begin.get("base_checksum") != self.checksum
                                or self.version is None):
            raise BaseMismatch(f"the delta is against version {begin.get('base_version')!r}; "
                               f"this receiver holds {self.version!r}")
        if mode not in ("delta", "full"):
            raise wire.WireError(f"unknown mode {mode!r}")
        if not isinstance(begin.get("weight_version"), str) or not isinstance(begin.get("count"), int):
            raise wire.WireError("the begin frame needs weight_version (a string) and count (an integer)")
        tensors: dict[str, torch.Tensor] = {}
        metas: dict[str, codec.TensorMeta] = {}
        pending: asyncio.Future | None = None  # decode one tensor while the next frame arrives
        try:
            async for header, payload in frames:
                if header.get("kind") == "end":
                    break
                meta = _tensor_meta(header)
                encoding = header.get("encoding")
                if mode == "full" and encoding != "raw":
                    raise codec.DeltaDecodeError(f"{meta.name}: a full transfer carries raw tensors, got {encoding!r}")
                if pending is not None:
                    await pending
                pending = asyncio.create_task(self._decode_into(tensors, metas, meta, encoding, payload))
            else:
                raise wire.WireError("stream ended without its 'end' frame")
            if pending is not None:
                await pending
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
        if len(metas) != begin["count"]:
            raise wire.WireError(f"stream announced {begin.get('count')} tensors and carried {len(metas)}")
        checksum = codec.state_checksum(metas.values())
        if checksum != begin.get("checksum"):
            raise codec.DeltaDecodeError("whole-state checksum mismatch after reconstruction")
        return Received(str(begin["weight_version"]), tensors, metas, checksum, mode, wire_bytes,
                        bool(begin.get("flush_cache", True)))

    async def _decode_into(self, tensors: dict, metas: dict, meta: codec.TensorMeta, encoding: str | None,
                           payload: bytes) -> None:
        if meta.name in metas:
            raise wire.WireError(f"tensor {meta.name!r} sent twice")
        base_meta = self.metas.get(meta.name)
        if encoding == "same":
            # Identical to the base: reuse its tensor (never mutated in place) unread.
            if base_meta is None or base_meta != meta:
                raise codec.DeltaDecodeError(f"{meta.name}: 'same' as a base tensor that differs or is missing")
            tensors[meta.name] = self.tensors[meta.name]
        else:
            base = None
            if encoding == "xor":
                if base_meta is None or (base_meta.dtype, base_meta.shape) != (meta.dtype, meta.shape):
                    raise codec.DeltaDecodeError(f"{meta.name}: no base tensor of that dtype and shape")
                base = codec.tensor_bytes(self.tensors[meta.name])
            tensors[meta.name] = await asyncio.to_thread(codec.decode, encoding or "", payload, meta, base)
        metas[meta.name] = meta


def _tensor_meta(header: dict) -> codec.TensorMeta:
    try:
        return codec.TensorMeta(str(header["name"]), str(header["dtype"]), tuple(int(d) for d in header["shape"]),
                                str(header["checksum"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise wire.WireError(f"malformed tensor frame header {header!r}") from exc


async def _drain(request: web.Request) -> None:
    """Read the rest of a refused body, so the sender gets the answer rather than a reset connection
    (aiohttp itself drains an unread body for at most its lingering time, 10 s: short for a slow link)."""
    while await request.content.readany():
        pass


def _answer(success: bool, message: str, version: str | None, status: int, reason: str | None = None,
            **extra: object) -> web.Response:
    body: dict[str, object] = {"success": success, "message": message, "weight_version": version, **extra}
    if reason:
        body["reason"] = reason
    return web.json_response(body, status=status)


def routes(receiver: DeltaReceiver, load: Loader, served: ServedChecksum | None = None) -> list[web.RouteDef]:
    """The two endpoints of wire.py over ``receiver``; ``load`` puts checked weights into the engine.

    ``served`` (where the engine's tensors are at hand, as in the CPU engine) answers
    ``GET /weights_delta/state?served=1`` with ``served_checksum`` too: the checksum of what the
    engine serves under the base's names (tests, debugging).
    """

    async def state(request: web.Request) -> web.Response:
        body: dict[str, object] = dict(receiver.state())
        if served is not None and request.query.get("served") and receiver.metas:
            body["served_checksum"] = await served(sorted(receiver.metas))
        return web.json_response(body)

    async def update(request: web.Request) -> web.Response:
        async with receiver._lock:
            try:
                received = await receiver.receive(request.content.readexactly)
            except BaseMismatch as exc:
                await _drain(request)
                return _answer(False, str(exc), receiver.version, 409, "base_mismatch")
            except codec.DeltaDecodeError as exc:
                # The base may be what is wrong: only a full transfer is trusted next.
                receiver.drop_base()
                log.error("weight delta rejected: %s", exc)
                await _drain(request)
                return _answer(False, str(exc), None, 422, "checksum_mismatch")
            except wire.WireError as exc:
                await _drain(request)
                return _answer(False, str(exc), receiver.version, 400, "corrupt")
            try:
                served_checksum = await load(received.tensors, received.version, received.flush_cache)
            except LoadRejected as exc:
                return _answer(False, str(exc), receiver.version, 400, "rejected")
            receiver.commit(received)
            log.info("weights v%s loaded from a %s transfer of %d bytes", received.version, received.mode,
                     received.wire_bytes)
            return _answer(True, f"Succeeded to update model weights from a {received.mode} transfer. "
                           f"Weight version updated to {received.version}.", received.version, 200,
                           mode=received.mode, wire_bytes=received.wire_bytes, checksum=received.checksum,
                           served_checksum=served_checksum)

    return [web.get(wire.STATE_PATH, state), web.post(wire.UPDATE_PATH, update)]
