"""Run checkpoints: the trainer's Megatron checkpoint plus everything else a resume needs.

``<save>/step_<N>/trainer/`` holds model, optimizer, LR schedule and RNG (Megatron distributed
checkpoint), ``critic/`` the same for PPO's value model; ``run_state.json`` holds the step, the
policy version, the data cursor, prompts whose groups were in flight, and the buffer's groups, so
a resumed run neither skips nor repeats a prompt. ``<save>/latest`` names the newest complete step directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import logging

import orjson

from slime_async.actor import ActorRef
from slime_async.config.sections import CheckpointConfig

STATE_FILE = "run_state.json"
CRITIC_DIR = "critic"

log = logging.getLogger(__name__)


class RunCheckpointer:
    def __init__(self, config: CheckpointConfig, *, trainer: ActorRef | None, rollout: ActorRef, buffer: ActorRef,
                 critic: bool = False):
        self.config = config
        self.trainer = trainer
        self.critic = critic and trainer is not None  # the trainer actor also runs PPO's critic group
        self.rollout = rollout
        self.buffer = buffer

    @property
    def enabled(self) -> bool:
        return bool(self.config.save)

    def due(self, step: int) -> bool:
        interval = self.config.save_interval
        return self.enabled and interval is not None and step % interval == 0

    async def save(self, step: int, version: int) -> Path:
        # Absolute: the trainer ranks run in the repository root, not the user's directory.
        root = Path(self.config.save).resolve()
        directory = root / f"step_{step:06d}"
        directory.mkdir(parents=True, exist_ok=True)
        if self.trainer is not None:
            await self.trainer.ask("save", str(directory / "trainer"), timeout=None)
            if self.critic:
                await self.trainer.ask("save_critic", str(directory / CRITIC_DIR), timeout=None)
            if self.config.save_hf:
                await self.trainer.ask("export_hf", str(Path(self.config.save_hf.format(step=step)).resolve()),
                                       timeout=None)
        # Rollout first, then buffer: a group leaves the rollout's in-flight set in the same tick
        # as its `put` enters the buffer's mailbox, ahead of this `state_dict`, so no group can
        # be in neither snapshot; one can be in both, and is then kept only as buffered.
        rollout_state = await self.rollout.ask("state_dict")
        buffer_state = await self.buffer.ask("state_dict")
        rollout_state["pending_prompts"] = without_buffered(rollout_state["pending_prompts"], buffer_state)
        state = {"step": step, "version": version, "rollout": rollout_state, "buffer": buffer_state}
        (directory / STATE_FILE).write_bytes(orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY))
        # Written last: a crash mid-save leaves the previous checkpoint as the latest.
        (root / "latest").write_text(directory.name)
        return directory

    async def load(self, path: str) -> tuple[int, int]:
        """Restore from a step directory or a save root (its latest); returns (step, version)."""
        directory = checkpoint_directory(path).resolve()
        state = read_run_state(directory)
        if self.trainer is not None:
            await self.trainer.ask("load", str(directory / "trainer"), timeout=None)
            if self.critic and (directory / CRITIC_DIR).is_dir():
                await self.trainer.ask("load_critic", str(directory / CRITIC_DIR), timeout=None)
            elif self.critic:
                # A checkpoint of a run without a critic (GRPO, say) continued as PPO.
                log.warning("--load %s has no %s/: the critic starts fresh", directory, CRITIC_DIR)
        await self.rollout.ask("load_state_dict", state["rollout"])
        await self.buffer.ask("load_state_dict", state["buffer"])
        return int(state["step"]), int(state["version"])


def without_buffered(pending_prompts: list[dict[str, Any]], buffer_state: dict[str, Any]) -> list[dict[str, Any]]:
    """The rollout's pending prompts less those whose group is already in the buffer's state."""
    buffered = {sample["group_index"] for group in buffer_state["groups"] for sample in group}
    return [p for p in pending_prompts if p["group_index"] is None or p["group_index"] not in buffered]


def checkpoint_directory(path: str | Path) -> Path:
    """``path`` itself (a step directory), or the latest step directory of a save root."""
    directory = Path(path)
    if (directory / "latest").is_file():
        directory = directory / (directory / "latest").read_text().strip()
    return directory


def read_run_state(directory: Path) -> dict[str, Any]:
    state_file = directory / STATE_FILE
    if not state_file.is_file():
        raise FileNotFoundError(f"--load {directory}: no {STATE_FILE} there")
    return orjson.loads(state_file.read_bytes())


def latest_checkpoint(save: str | Path | None) -> Path | None:
    """The newest complete checkpoint under the save root ``save``, if any."""
    if not save or not (Path(save) / "latest").is_file():
        return None
    return checkpoint_directory(save)
