"""`MonitorConfig`: the monitor section (TensorBoard, metrics.jsonl, the console, the timeline
trace, wandb with slime's flag names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help
from slime_async.config.paths import require_writable_dir


@dataclass
class MonitorConfig:
    tensorboard: bool = field(default=True, metadata=_help("write TensorBoard event files"))
    tensorboard_dir: str | None = field(default=None, metadata=_help(
        "directory of the TensorBoard event files; none = <run_dir>/tb"))
    metrics_jsonl: bool = field(default=True, metadata=_help(
        "also write every metric as one JSON line per log call to <run_dir>/metrics.jsonl"))
    progress_bar: bool = field(default=True, metadata=_help(
        "show a progress bar (steps, reward, tokens/s) when the console is a terminal"))
    log_interval: int = field(default=1, metadata=_help(
        "print a one-line summary of the key metrics every N steps; 0 = never"))
    trace_dir: str | None = field(default=None, metadata=_help(
        "write a Chrome/Perfetto timeline of the run to DIR/trace.json (generation requests per engine, "
        "rewards, trainer ops, weight-sync phases, buffer waits); render it with benchmarks/render_trace.py"))
    trace_max_events: int = field(default=200_000, metadata=_help(
        "--trace-dir: keep at most this many spans; later ones are dropped and counted in the file"))
    # wandb, with slime's flag names (--wandb-key is left out: a key in a flag is printed at start
    # and saved in <run_dir>/config.yaml; wandb reads WANDB_API_KEY or `wandb login`).
    use_wandb: bool = field(default=False, metadata=_help(
        "also log every metric to a Weights & Biases run (needs pip install 'slime-async[wandb]')"))
    wandb_project: str | None = field(default="slime-async", metadata=_help("wandb project"))
    wandb_team: str | None = field(default=None, metadata=_help(
        "wandb entity (team or user); none = your default entity"))
    wandb_group: str | None = field(default=None, metadata=_help("wandb group of the run"))
    wandb_run_name: str | None = field(default=None, metadata=_help(
        "wandb run name; none = the run directory's name"))
    wandb_mode: Literal["online", "offline", "disabled"] | None = field(default=None, metadata=_help(
        "online, offline (files only, upload later with `wandb sync`) or disabled; none = WANDB_MODE, "
        "else online"))
    wandb_dir: str | None = field(default=None, metadata=_help(
        "directory of the wandb files (they go in its wandb/ folder); none = the run directory"))
    wandb_host: str | None = field(default=None, metadata=_help(
        "URL of a self-hosted wandb server; none = WANDB_BASE_URL, else wandb.ai"))
    wandb_run_id: str | None = field(default=None, metadata=_help(
        "log to the wandb run with this id (continued if it exists); none = a new run, or the run "
        "this run directory logged to when the run resumes or restarts"))

    def validate(self) -> None:
        if self.log_interval < 0:
            raise ValueError(f"--log-interval must be >= 0, got {self.log_interval}")
        if self.trace_max_events < 1:
            raise ValueError(f"--trace-max-events must be >= 1, got {self.trace_max_events}")

    def preflight(self) -> None:
        """wandb imports and, online, has an API key: checked at start, before anything is
        spawned (the monitor, which starts wandb, starts after the engines); so are --tensorboard-dir and
        --trace-dir."""
        if self.tensorboard and self.tensorboard_dir:
            require_writable_dir(self.tensorboard_dir, "--tensorboard-dir")
        if self.trace_dir:
            require_writable_dir(self.trace_dir, "--trace-dir")
        if not self.use_wandb:
            return
        try:
            import wandb
        except ImportError as error:
            raise ValueError(f"--use-wandb needs the wandb package ({error}): "
                             "pip install 'slime-async[wandb]'") from None
        mode = self.wandb_mode or wandb.setup().settings.mode  # none: WANDB_MODE or wandb's settings
        if mode in ("online", "run") and not wandb.login(host=self.wandb_host, verify=False, prompt=False):
            raise ValueError("--use-wandb: no wandb API key for online mode (set WANDB_API_KEY or run "
                             "`wandb login`), or log offline with --wandb-mode offline")
