"""Read back what an offline wandb run wrote: the records of its ``run-<id>.wandb`` file.

wandb 0.31 ships no Python reader (``wandb sync`` is wandb-core's), so this is the file format
itself, as wandb-core writes it: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then
LevelDB-log blocks of 32 KiB, each record a 7-byte header (CRC32C, length, type: 1 full, 2 first,
3 middle, 4 last) and its bytes; a whole record is one serialized ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def run_files(wandb_dir: Path) -> list[Path]:
    """The ``.wandb`` files of the offline runs under ``wandb_dir`` (the folder named wandb/), in
    the order the runs ended (the folders are named by start second and id, not in order)."""
    return sorted(wandb_dir.glob("offline-run-*/run-*.wandb"), key=lambda path: path.stat().st_mtime_ns)


def records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    assert HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), f"{path}: not a wandb transaction log"
    pos, pending = HEADER.size, b""
    while pos + CHUNK.size <= len(data):
        if BLOCK - pos % BLOCK < CHUNK.size:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = CHUNK.unpack_from(data, pos)
        pending += data[pos + CHUNK.size:pos + CHUNK.size + length]
        pos += CHUNK.size + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record
        elif kind not in (FIRST, MIDDLE):  # zero padding at the end of a block
            pending = b""


def history(path: Path) -> list[dict[str, Any]]:
    """Every history row (one ``run.log`` call), wandb's own ``_`` keys left out."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_")})
    return rows


def the_record(path: Path, kind: str) -> Any:
    """The one record of ``kind`` (``run``, ``exit``, ...) in the file."""
    (found,) = [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]
    return found


def run_config(path: Path) -> dict[str, Any]:
    run = the_record(path, "run")
    return {item.key: json.loads(item.value_json) for item in run.config.update if not item.key.startswith("_")}
