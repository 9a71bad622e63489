"""The monitor: where every metric of the run ends up (TensorBoard, metrics.jsonl, the console,
optionally wandb).

- ``actor``: `MonitorActor`, which writes each ``log(step, metrics)`` call everywhere;
- ``config``: `MonitorConfig`, the monitor section of the run config;
- ``wandb_logger``: `WandbLogger`, the optional Weights & Biases run (``--use-wandb``).
"""

from actors.monitor.actor import MonitorActor
from actors.monitor.config import MonitorConfig

__all__ = ["MonitorActor", "MonitorConfig"]
