"""What the head and an agent say to each other over their websocket (JSON messages).

    agent -> head   {"register": {"node_ip", "hostname", "gpus", "node_rank", "pid"}}
    head  -> agent  {"id": N, "op": "start" | "stop" | "free_port" | "read_file" | "write_file", ...}
    agent -> head   {"id": N, "ok": true, "result": ...} | {"id": N, "ok": false, "error": TEXT, ...}
    agent -> head   {"event": "exited", "child": ID, "returncode": RC, "log_path": PATH, "tail": TEXT}

A process spec travels without its readiness probe (a function): only an HTTP probe's URL,
which the agent probes from its own node.
"""

from __future__ import annotations

import sys
from typing import Any

from slime_async.process import ProcessSpec, http_ready

# argv[0] that stands for "this node's Python" (nodes may install the same venv at other paths)
PYTHON = "{python}"


def encode_spec(spec: ProcessSpec) -> dict[str, Any]:
    ready_url = getattr(spec.ready, "url", None)
    if spec.ready is not None and ready_url is None:
        raise ValueError(f"process {spec.name!r} has a readiness probe an agent cannot run (only HTTP probes travel)")
    argv = [PYTHON if i == 0 and arg == sys.executable else arg for i, arg in enumerate(spec.argv)]
    return {"name": spec.name, "argv": argv, "env": spec.env, "cwd": spec.cwd, "ready_url": ready_url,
            "ready_timeout": spec.ready_timeout, "ready_interval": spec.ready_interval,
            "stop_timeout": spec.stop_timeout}


def decode_spec(data: dict[str, Any], env: dict[str, str]) -> ProcessSpec:
    """The spec on the agent's node; ``env`` (this node's address and interfaces) is added."""
    argv = [sys.executable if i == 0 and arg == PYTHON else arg for i, arg in enumerate(data["argv"])]
    url = data.get("ready_url")
    return ProcessSpec(name=data["name"], argv=argv, env={**data.get("env", {}), **env}, cwd=data.get("cwd"),
                       ready=http_ready(url) if url else None, ready_timeout=data["ready_timeout"],
                       ready_interval=data["ready_interval"], stop_timeout=data["stop_timeout"])
