"""WandbLogger: the monitor's optional Weights & Biases run (``--use-wandb``).

It receives exactly the scalars the monitor writes to TensorBoard and metrics.jsonl, at the same
steps. The monitor's ``step`` is logged as the metric ``step`` and every other metric is plotted
against it (``define_metric``), rather than used as wandb's own step: wandb drops a row whose step
is lower than one already logged, and an evaluation finishing late logs an earlier step than the
rollout metrics before it. So each log call is one history row, as it is one line of metrics.jsonl.

wandb calls can block (``init`` starts the wandb-core service and, online, talks to the server;
``log`` hands a row to the service over a socket; ``finish`` waits for the upload), so they all
run on one daemon thread of the logger's own, in order, never on the event loop. A daemon thread
because an online ``finish`` that outlasts ``FINISH_TIMEOUT_S`` must not keep the process alive.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from actors.monitor.config import MonitorConfig

log = logging.getLogger(__name__)

# How long closing waits for wandb.finish (online: the last upload) before the run goes on
# stopping; whatever was not uploaded stays in the run's .wandb file for `wandb sync`.
FINISH_TIMEOUT_S = 120.0
# The file in the run directory (not in --wandb-dir, which several runs may share) that keeps the
# wandb run id, so that a restart or a resume into the same run directory continues that wandb run.
RUN_ID_FILE = "wandb-run-id"


class WandbLogger:
    """One wandb run for one monitor: ``await start()``, ``log(step, scalars)``, ``await close()``.

    ``run_dir`` is the run directory: the wandb files go under ``--wandb-dir`` (default the run
    directory) in ``wandb/``; the run's config is ``<run_dir>/config.yaml`` as the launcher dumped
    it; ``resume`` (the monitor was given a resume step) continues the wandb run this run
    directory logged to before, unless ``--wandb-run-id`` names one.
    """

    def __init__(self, config: MonitorConfig, run_dir: Path, *, resume: bool = False):
        self.config = config
        self.run_dir = run_dir
        self.dir = Path(config.wandb_dir) if config.wandb_dir else run_dir
        self.resume = resume
        self._worker = _OrderedThread("wandb")
        self._run: Any = None  # wandb.Run, touched only on the worker thread
        self._error: BaseException | None = None  # the first failed log call

    async def start(self) -> None:
        """Create (or continue) the wandb run; raises what ``wandb.init`` raised."""
        try:
            await self._call(self._init)
        except BaseException:
            self._worker.stop()
            raise

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Queue one history row; raises the error of an earlier row that wandb refused."""
        if self._error is not None:
            raise RuntimeError(f"wandb: logging failed: {self._error!r}") from self._error
        row = {"step": step, **scalars}
        self._worker.submit(lambda: self._run.log(row)).add_done_callback(self._note_error)

    async def close(self, exit_code: int = 0) -> None:
        """Finish the run (after every queued row) and end the thread; ``exit_code`` non-zero
        marks the run failed in wandb."""
        try:
            await asyncio.wait_for(self._call(lambda: self._finish(exit_code)), FINISH_TIMEOUT_S)
        except TimeoutError:
            log.warning("wandb: finish did not return within %.0f s; what was not uploaded stays in %s "
                        "(upload it with `wandb sync`)", FINISH_TIMEOUT_S, self.dir / "wandb")
        finally:
            self._worker.stop()

    # ----- on the worker thread -------------------------------------------------------------
    def _init(self) -> None:
        import wandb

        c = self.config
        settings: dict[str, Any] = {
            # wandb would otherwise wrap stdout/stderr: the progress bar and our log lines stay ours.
            "console": "off",
            # Its start lines (where the run is) stay; the ~35-line history summary at the end goes.
            "quiet": True,
            # More than one run per process (tests, a restarted attempt) without finishing another.
            "reinit": "create_new",
        }
        if c.wandb_mode is not None:  # none: wandb's own default (WANDB_MODE, else online)
            settings["mode"] = c.wandb_mode
        if c.wandb_host is not None:
            settings["base_url"] = c.wandb_host
        run_id = c.wandb_run_id or self._saved_run_id()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=c.wandb_project, entity=c.wandb_team, group=c.wandb_group,
            name=c.wandb_run_name or self.run_dir.name, id=run_id, resume="allow" if run_id else None,
            dir=str(self.dir), config=self._run_config(), settings=wandb.Settings(**settings))
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        (self.run_dir / RUN_ID_FILE).write_text(self._run.id + "\n")

    def _finish(self, exit_code: int) -> None:
        import wandb

        self._run.finish(exit_code=exit_code)
        # finish() returns before wandb-core has written the run's .wandb file out (right after
        # it, the file sometimes held only its header); tearing the service down waits for that.
        # The service is the process's, and the monitor is the process's one wandb user.
        wandb.teardown(exit_code)

    def _saved_run_id(self) -> str | None:
        path = self.run_dir / RUN_ID_FILE
        if not self.resume or not path.is_file():
            return None
        return path.read_text().strip() or None

    def _run_config(self) -> dict[str, Any]:
        path = self.run_dir / "config.yaml"
        if not path.is_file():  # a monitor started on its own (tests, tools)
            return {}
        return yaml.safe_load(path.read_text()) or {}

    # ----- on the event loop ----------------------------------------------------------------
    async def _call(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.wrap_future(self._worker.submit(fn))

    def _note_error(self, future: concurrent.futures.Future) -> None:
        if self._error is None and not future.cancelled() and future.exception() is not None:
            self._error = future.exception()


class _OrderedThread:
    """Runs submitted callables one at a time, in submission order, on one daemon thread."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, future))
        return future

    def stop(self) -> None:
        """End the thread once the callables queued so far have run."""
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as error:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(error)
