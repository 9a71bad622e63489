"""One `slime-async train` as a real process, for the e2e tests: its metrics and trained samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from actors.loop.debug_dump import read_groups


def train(root: Path, argv: list[str], *, import_dirs: tuple[Path, ...] = (), timeout: float = 600) -> dict[str, Any]:
    """Run ``slime-async train ARGV --run-dir root/run --save-debug-rollout-data root/dump`` in
    ``root`` (hook modules importable from ``import_dirs``) and fail the test with the tail of its
    stderr if it fails. Returns metrics.jsonl's rows, the dumped training samples and stderr."""
    run_dir, dump = root / "run", root / "dump"
    command = [sys.executable, "-m", "actors.loop.cli", "train", "--run-dir", str(run_dir),
               "--save-debug-rollout-data", str(dump), "--no-progress-bar", *argv]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, import_dirs), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    dumped = [group for path in sorted(dump.glob("step_*.jsonl")) for group in read_groups(path)]
    return {"metrics": metrics, "samples": [s for group in dumped for s in group], "stderr": result.stderr,
            "dump": dump}
