"""MonitorActor: where every metric of the run ends up.

Each ``log(step, metrics)`` call writes the scalars three ways, four with ``--use-wandb``:

- TensorBoard event files (``--tensorboard-dir``, default ``<run_dir>/tb``), values as they are
  (NaN and inf included: TensorBoard shows them, and hiding a NaN loss would hide a bug);
- one JSON line in ``<run_dir>/metrics.jsonl``: ``{"step": .., "time": .., <name>: <value>}``,
  with NaN/inf written as null so every line is valid JSON for any reader; the file is appended
  to, so a resumed run continues it;
- a console progress bar (steps done / total, reward, tokens/s) when stderr is a terminal, and
  every ``--log-interval`` steps a one-line summary of the key metrics;
- with ``--use-wandb``, one row of a wandb run (``actors/monitor/wandb_logger.py``; the same names and
  values, plotted against ``step``), logged off the event loop.

``step`` is the number of training steps done when the metrics were taken (0 before the
first), the same x-axis for rollout, train, perf and eval scalars. The writes are small and
buffered, so they run inside the mailbox; a metric whose value is not a number is skipped with
one warning per name rather than failing the actor (``log`` is usually sent with ``tell``).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from actors.monitor.config import MonitorConfig
from actors.monitor.wandb_logger import WandbLogger
from slime_async.actor import Actor

log = logging.getLogger(__name__)

# Shown in the console summary line, in this order, when a log call carries them.
SUMMARY_KEYS = (
    "rollout/reward_mean",
    "eval/reward_mean",
    "train/loss",
    "train/pg_loss",
    "train/kl",
    "train/grad_norm",
    "rollout/response_len_mean",
    "buffer/size",
    "perf/rollout_tokens_per_s",
    "perf/step_time",
)
REWARD_KEY = "rollout/reward_mean"
TOKENS_PER_S_KEY = "perf/rollout_tokens_per_s"


class MonitorActor(Actor):
    """``run_dir``: where metrics.jsonl (and by default tb/) go; ``total_steps``: the bar's end;
    ``resume_step``: the step a resumed run restarts from — TensorBoard then hides the points the
    interrupted run logged at that step and later (they were never checkpointed);
    ``console``: the bar's stream (stderr by default; it is shown only if that is a terminal)."""

    name = "monitor"

    def __init__(
        self,
        config: MonitorConfig,
        run_dir: str | Path,
        *,
        total_steps: int | None = None,
        resume_step: int | None = None,
        console: TextIO | None = None,
        name: str | None = None,
    ):
        super().__init__(name)
        config.validate()
        self.config = config
        self.run_dir = Path(run_dir)
        self.tensorboard_dir = Path(config.tensorboard_dir) if config.tensorboard_dir else self.run_dir / "tb"
        self.jsonl_path = self.run_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.resume_step = resume_step
        self._console = console if console is not None else sys.stderr
        self._writer: Any = None  # torch.utils.tensorboard.SummaryWriter
        self._jsonl: TextIO | None = None
        self._bar: Any = None  # tqdm
        self._wandb: WandbLogger | None = None
        self._outcome = 0  # the run's exit code, told by the launcher (set_outcome)
        self._last: dict[str, float] = {}  # latest reward / tokens/s for the bar
        self._warned: set[str] = set()

    async def on_start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.config.use_wandb:  # first: if wandb cannot start, no file is left open
            wandb = WandbLogger(self.config, self.run_dir, resume=self.resume_step is not None)
            await wandb.start()
            self._wandb = wandb
        if self.config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.tensorboard_dir), flush_secs=10,
                                         purge_step=self.resume_step)
        if self.config.metrics_jsonl:
            self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        if self.config.progress_bar and _is_tty(self._console):
            from tqdm import tqdm

            self._bar = tqdm(total=self.total_steps, initial=self.resume_step or 0, desc="train", unit="step",
                             file=self._console, dynamic_ncols=True)

    async def on_stop(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()  # flushes
        if self._jsonl is not None:
            self._jsonl.close()
        if self._wandb is not None:
            # Marked failed in wandb when the run did not end with 0 or the monitor itself failed
            # (a metric wandb refused, ...).
            await self._wandb.close(exit_code=self._outcome if self._failure is None else 1)

    # ----- handlers ---------------------------------------------------------------------------
    def set_outcome(self, exit_code: int) -> None:
        """How the run ended (its exit code), told by the launcher before the tree stops."""
        self._outcome = exit_code

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` at ``step`` in TensorBoard, metrics.jsonl, wandb and on the console."""
        now = time.time()
        scalars = self._scalars(metrics)
        if self._writer is not None:
            for name, value in scalars.items():
                self._writer.add_scalar(name, value, global_step=step, walltime=now)
        if self._jsonl is not None:
            row = {"step": step, "time": now} | {k: (v if math.isfinite(v) else None) for k, v in scalars.items()}
            self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
            # One line per step, seconds apart: flushing each keeps the file current for a
            # reader (and loses nothing on a crash) at no measurable cost.
            self._jsonl.flush()
        if self._wandb is not None:
            self._wandb.log(step, scalars)
        self._update_bar(step, scalars)
        interval = self.config.log_interval
        if interval and step % interval == 0:
            self._summarize(step, scalars)

    def flush(self) -> None:
        """Push everything written so far to disk (TensorBoard flushes on its own every 10 s; wandb
        writes its rows as they come, and stopping the monitor waits for them)."""
        if self._writer is not None:
            self._writer.flush()
        if self._jsonl is not None:
            self._jsonl.flush()

    # ----- internals ----------------------------------------------------------------------------
    def _scalars(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        scalars: dict[str, float] = {}
        for name, value in metrics.items():
            try:
                if not isinstance(name, str) or name in ("step", "time"):
                    raise TypeError(f"metric name {name!r} is not a string or is reserved")
                scalars[name] = float(value)
            except (TypeError, ValueError) as error:
                if str(name) not in self._warned:
                    self._warned.add(str(name))
                    log.warning("monitor: metric %r skipped (value %r is not a number: %s)", name, value, error)
        return scalars

    def _update_bar(self, step: int, scalars: dict[str, float]) -> None:
        for key in (REWARD_KEY, TOKENS_PER_S_KEY):
            if key in scalars:
                self._last[key] = scalars[key]
        if self._bar is None:
            return
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)
        parts = []
        if REWARD_KEY in self._last:
            parts.append(f"reward={self._last[REWARD_KEY]:.3f}")
        if TOKENS_PER_S_KEY in self._last:
            parts.append(f"tok/s={self._last[TOKENS_PER_S_KEY]:.0f}")
        self._bar.set_postfix_str(" ".join(parts), refresh=False)
        # Explicitly: tqdm skips redraws within its mininterval, and steps are rare anyway.
        self._bar.refresh()

    def _summarize(self, step: int, scalars: dict[str, float]) -> None:
        shown = [f"{key}={scalars[key]:.4g}" for key in SUMMARY_KEYS if key in scalars]
        shown += [f"{key}={value:.4g}" for key, value in scalars.items()
                  if key.startswith("eval/") and key not in SUMMARY_KEYS]
        if not shown:
            return
        line = f"step {step}: " + " ".join(shown)
        if self._bar is not None:
            self._bar.write(line, file=self._console)  # above the bar instead of through it
        else:
            log.info("%s", line)


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
