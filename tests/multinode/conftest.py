"""Fixtures of the multi-node tests: a head in the test's event loop and real agent processes
bound to a second loopback address (127.0.0.2), which stands for a second node."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chaos"))  # the shared DescendantTracker

from agent_process import start_agent  # noqa: E402


@pytest.fixture
def agents(tmp_path) -> Iterator:
    """``agents(head, *flags) -> Popen``; every agent (and its process group) is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(head: str, *extra: str, hide: Path | None = None) -> subprocess.Popen:
        process = start_agent(head, tmp_path / f"agent-{len(started)}.log", *extra, hide=hide)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
