"""Config sections owned by the runtime itself (the others live beside their actors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help
from slime_async.config.paths import require_dir, require_writable_dir


@dataclass
class ClusterConfig:
    run_dir: str = field(default="", metadata=_help("run directory for logs, config.yaml, checkpoints; "
                                                     "default runs/<date-time>"))
    event_loop: Literal["auto", "uvloop", "asyncio"] = field(default="auto", metadata=_help(
        "asyncio event loop; auto = uvloop when installed"))
    log_level: Literal["debug", "info", "warning", "error"] = field(default="info", metadata=_help("console log level"))
    supervisor_max_restarts: int = field(default=3, metadata=_help(
        "restarts a supervisor allows within --supervisor-max-seconds before it stops the run"))
    supervisor_max_seconds: float = field(default=60.0, metadata=_help("the window of --supervisor-max-restarts"))
    node_ip: str | None = field(default=None, metadata=_help(
        "this (the head) node's address, which agents, trainer ranks and engines on other nodes reach; default: "
        "127.0.0.1 on one node, the address of the default route on several"))
    agent_port: int = field(default=29700, metadata=_help(
        "port the head listens on for node agents (`slime-async agent --head NODE_IP:PORT`; multi-node runs)"))
    agent_wait_timeout: float = field(default=300.0, metadata=_help(
        "seconds the head waits at start for the agents of the other nodes to register"))

    def validate(self) -> None:
        if self.supervisor_max_restarts < 0:
            raise ValueError("--supervisor-max-restarts must be >= 0")
        if self.supervisor_max_seconds <= 0:
            raise ValueError("--supervisor-max-seconds must be > 0")
        if not 0 <= self.agent_port <= 65535:
            raise ValueError(f"--agent-port must be a port number, got {self.agent_port}")
        if self.agent_wait_timeout <= 0:
            raise ValueError(f"--agent-wait-timeout must be > 0, got {self.agent_wait_timeout}")
        if self.node_ip is not None and not self.node_ip.strip():
            raise ValueError("--node-ip must not be empty")

    def preflight(self) -> None:
        require_writable_dir(self.run_dir or "runs", "--run-dir")  # the default is runs/<date-time>


@dataclass
class CheckpointConfig:
    save: str | None = field(default=None, metadata=_help(
        "directory for run checkpoints (model, optimizer, data cursor, buffer, partial rollouts)"))
    load: str | None = field(default=None, metadata=_help("resume from this checkpoint: a step directory, or a --save root (its latest)"))
    save_interval: int | None = field(default=None, metadata=_help("save every N training steps (and at the end of the run)"))
    save_hf: str | None = field(default=None, metadata=_help(
        "also export HF-format weights here at each save ({step} is replaced by the step; an SFT run "
        "with {step} in the path exports after every step)"))
    max_run_restarts: int = field(default=3, metadata=_help(
        "when an RL run that has trained fails (a trainer rank dies, engines run out of restarts...), "
        "restart the whole run from the latest checkpoint in --save up to this many times; needs --save"))

    def validate(self) -> None:
        if self.max_run_restarts < 0:
            raise ValueError("--max-run-restarts must be >= 0")
        if self.save_interval is not None and self.save_interval <= 0:
            raise ValueError("--save-interval must be > 0")
        if self.save_interval is not None and not self.save:
            raise ValueError("--save-interval needs --save DIR")

    def preflight(self) -> None:
        if self.load:
            require_dir(self.load, "--load")
        if self.save:
            require_writable_dir(self.save, "--save")
