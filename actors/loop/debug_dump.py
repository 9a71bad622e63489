"""Rollout dumps: every training batch's samples as JSON lines (``--save-debug-rollout-data``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import orjson

from slime_async.sample import Sample


def dump_groups(directory: str | Path, step: int, groups: Sequence[Sequence[Sample]]) -> Path:
    path = Path(directory) / f"step_{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for group in groups:
            handle.write(orjson.dumps([sample.to_dict() for sample in group]) + b"\n")
    return path


def read_groups(path: str | Path) -> list[list[dict]]:
    """One dump file's groups, as the sample dicts it holds. Lines end at b"\n" only: a response may
    hold U+2028 or U+0085 (orjson writes them raw), where ``str.splitlines`` would cut the line."""
    return [orjson.loads(line) for line in Path(path).read_bytes().split(b"\n") if line]


def load_groups(directory: str | Path) -> Iterator[tuple[int, list[list[Sample]]]]:
    """(step, groups) for every dump in ``directory``, in step order."""
    for path in sorted(Path(directory).glob("step_*.jsonl")):
        step = int(path.stem.split("_")[1])
        yield step, [[Sample.from_dict(d) for d in group] for group in read_groups(path)]
