"""The delta weight-sync wire protocol: HTTP on the engine's (or its receiver's) address.

Endpoints (served by the CPU engine itself, and by `actors.engine.delta_receiver` beside SGLang):

``GET /weights_delta/state`` -> ``{"weight_version": str | null, "checksum": str | null}``
    The version whose tensors the receiver holds as its base, and the whole-state checksum of
    that base; null when it holds none (a fresh or restarted receiver): then only a full
    transfer can be applied.

``POST /weights_delta/update`` (``Content-Type: application/x-slime-weight-delta``, sent with
``Transfer-Encoding: chunked`` so the sender streams while it encodes) -> JSON
``{"success": bool, "message": str, "weight_version": str | null, "reason"?: str}``
    The body is a stream, little-endian::

        b"SAWD" u8 protocol(=1)
        frame*:  u32 header_length | header (JSON, UTF-8) | payload (header["nbytes"] bytes)

    frames, in order:

    - ``{"kind": "begin", "mode": "delta"|"full", "base_version", "base_checksum",
      "weight_version", "count", "checksum", "flush_cache"}``: the version the delta is against
      (null for full), the version and whole-state checksum (codec.state_checksum) it produces,
      the number of tensor frames, and whether the engine may flush its prefix cache when it
      loads them (false while it holds requests: SGLang asserts on such a flush; default true);
    - ``count`` times ``{"kind": "tensor", "name", "dtype", "shape", "checksum", "encoding":
      "raw"|"xor"|"same", "nbytes"}`` + payload: one tensor (codec.encode);
    - ``{"kind": "end"}``.

    A delta also names every tensor (``same`` costs a header and no payload), so the receiver's
    new state is exactly the streamed set. The receiver answers:

    - 200 success: every tensor's checksum and the whole checksum matched, and the engine
      serves the new weights; the reconstructed state is its new base;
    - 409 ``reason: "base_mismatch"``: its base is not the stream's (restarted, or it missed a
      sync); the sender sends a full transfer instead;
    - 422 ``reason: "checksum_mismatch"`` (or ``"corrupt"``): a tensor did not reconstruct; the
      receiver drops its base (next transfer must be full) and the sender retries at once with
      a full transfer;
    - 400 ``reason: "rejected"``: the engine refused the weights (names, shapes): not retried.

    Nothing is applied before the whole stream has arrived and been checked.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

MAGIC = b"SAWD"
PROTOCOL = 1
CONTENT_TYPE = "application/x-slime-weight-delta"
STATE_PATH = "/weights_delta/state"
UPDATE_PATH = "/weights_delta/update"
MAX_HEADER = 1 << 20  # a header is a few hundred bytes; more means a broken stream


class WireError(ValueError):
    """A stream that does not follow the protocol."""


def preamble() -> bytes:
    return MAGIC + bytes([PROTOCOL])


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    header = {**header, "nbytes": len(payload)}
    encoded = orjson.dumps(header)
    return struct.pack("<I", len(encoded)) + encoded + payload


async def read_frames(
    read_exactly: Callable[[int], Awaitable[bytes]],
) -> AsyncIterator[tuple[dict[str, Any], bytes]]:
    """(header, payload) of every frame after the preamble, through the ``end`` frame.

    ``read_exactly(n)`` returns n bytes or raises (aiohttp's ``StreamReader.readexactly``).
    """
    try:
        head = await read_exactly(len(MAGIC) + 1)
    except Exception as exc:  # noqa: BLE001 - an incomplete read of any kind
        raise WireError(f"stream ended before its preamble ({exc})") from exc
    if head[:4] != MAGIC or head[4] != PROTOCOL:
        raise WireError(f"not a weight-delta stream of protocol {PROTOCOL} (starts {head!r})")
    while True:
        try:
            (length,) = struct.unpack("<I", await read_exactly(4))
            if length > MAX_HEADER:
                raise WireError(f"frame header of {length} bytes (at most {MAX_HEADER})")
            header = orjson.loads(await read_exactly(length))
            nbytes = int(header.get("nbytes", 0))
            payload = await read_exactly(nbytes) if nbytes else b""
        except WireError:
            raise
        except Exception as exc:  # noqa: BLE001 - truncated body, bad JSON
            raise WireError(f"stream broken mid-frame ({exc})") from exc
        yield header, payload
        if header.get("kind") == "end":
            return
