"""The critic section: slime's flags for PPO with a value model (``--advantage-estimator ppo``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from slime_async.config.flags import field_help as _help

if TYPE_CHECKING:
    from actors.megatron.config import TrainerConfig


@dataclass
class CriticConfig:
    critic_load: str | None = field(default=None, metadata=_help(
        "initialise the critic's weights (value head included) from this critic checkpoint: a run "
        "checkpoint's critic/ directory, or a step directory / --save root holding one (default: the "
        "policy's --hf-checkpoint with a zero value head)"))
    critic_lr: float | None = field(default=None, metadata=_help("learning rate of the critic (default: --lr)"))
    num_critic_only_steps: int = field(default=0, metadata=_help(
        "the first N rollouts train the critic only (the policy is not updated)"))
    value_clip: float = field(default=0.2, metadata=_help(
        "clip of the value loss: the new value stays within this of the value predicted at rollout"))
    lambd: float = field(default=1.0, metadata=_help("GAE lambda of --advantage-estimator ppo"))

    def validate(self) -> None:
        if self.num_critic_only_steps < 0:
            raise ValueError(f"--num-critic-only-steps must be >= 0, got {self.num_critic_only_steps}")
        if self.value_clip <= 0:
            raise ValueError(f"--value-clip must be > 0, got {self.value_clip}")
        if not 0.0 <= self.lambd <= 1.0:
            raise ValueError(f"--lambd must be in [0, 1], got {self.lambd}")
        if self.critic_lr is not None and self.critic_lr <= 0:
            raise ValueError(f"--critic-lr must be > 0, got {self.critic_lr}")
        if self.critic_load is not None and critic_checkpoint(self.critic_load) is None:
            raise ValueError(f"--critic-load {self.critic_load}: no critic checkpoint there (a critic/ directory "
                             "written by --save, or a step directory / save root holding one)")

    def set_by_user(self) -> list[str]:
        """Flags of this section that differ from their defaults (they only act with a critic)."""
        default = CriticConfig()
        return [f"--{name.replace('_', '-')}" for name in ("critic_load", "critic_lr", "num_critic_only_steps",
                                                          "value_clip", "lambd")
                if getattr(self, name) != getattr(default, name)]


def critic_checkpoint(path: str | Path) -> Path | None:
    """The Megatron checkpoint directory of a critic: ``path`` itself, its ``critic/``, or the
    ``critic/`` of the latest step of a save root; None when there is none."""
    directory = Path(path)
    if (directory / "latest").is_file():
        directory = directory / (directory / "latest").read_text().strip()
    for candidate in (directory, directory / "critic"):
        if (candidate / "metadata.json").is_file():
            return candidate
    return None


def critic_trainer_config(trainer: TrainerConfig, critic: CriticConfig) -> TrainerConfig:
    """The critic group's trainer section: the policy's (architecture, parallelism, batch and
    schedule) with its own learning rate and no reference model."""
    megatron = dict(trainer.megatron)
    if critic.critic_lr is not None:
        megatron["lr"] = critic.critic_lr
    # The critic routes its own tokens: the engine's experts are the policy's routing (R3).
    return replace(trainer, megatron=megatron, use_reference=False, ref_load=None, use_rollout_routing_replay=False)


def check_run(advantage_estimator: str, critic: CriticConfig, *, loss_type: str, debug_rollout_only: bool,
              debug_train_only: bool) -> None:
    """Cross-section rules of PPO with a critic, checked at start (before anything spawns)."""
    if advantage_estimator != "ppo":
        stray = critic.set_by_user()
        if stray:
            raise ValueError(f"{stray[0]} applies to --advantage-estimator ppo (a critic), not {advantage_estimator}")
        return
    if loss_type != "policy_loss":
        raise ValueError(f"--advantage-estimator ppo trains a critic for RL; it does not apply to --loss-type {loss_type}")
    if debug_rollout_only:
        raise ValueError("--advantage-estimator ppo needs the critic, which --debug-rollout-only does not start")
    if debug_train_only:
        raise ValueError("--advantage-estimator ppo is not supported with --debug-train-only (the replay has no "
                         "critic values)")
