"""What the multi-node tests share: the second "node" (a loopback address) and starting an agent on it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SECOND_NODE = "127.0.0.2"


def start_agent(head: str, log_path: Path, *extra: str, hide: Path | None = None) -> subprocess.Popen:
    """``slime-async agent --head HEAD --node-ip 127.0.0.2`` as its own process (session).
    ``hide``: a directory the agent's "node" does not share with the head (an empty tmpfs over it,
    in a mount namespace of the agent's own)."""
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c",
              f'mount -t tmpfs none "{hide}" && exec "$0" "$@"'] if hide is not None else []
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [*prefix, sys.executable, "-m", "actors.loop.cli", "agent", "--head", head, "--node-ip", SECOND_NODE,
             "--log-dir", str(log_path.parent / "agent-logs"), *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])})
