"""The config of a training run: one typed section per component.

Each actor receives only its own section (no global ``args``). Cross-section rules that no
single section can check live in ``RunConfig.validate``; every value one section derives from
another (the staleness bound the mode implies, the router's default timeout, ...) is computed
once, by ``RunConfig.resolve``, which ``parse_run_config`` applies: launch hands the finished
sections out as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from actors.buffer import BufferConfig, default_capacity
from actors.critic.config import CriticConfig, check_run as check_critic_run
from actors.engine.config import ROUTED_EXPERTS_ARG, RUNTIME_OWNED_SGLANG_FIELDS, EngineConfig
from actors.loop.config import TrainConfig
from actors.loop.opd_config import check_opd, preflight_opd
from actors.megatron.config import TrainerConfig
from actors.monitor import MonitorConfig
from actors.rollout.config import RolloutConfig
from actors.router.config import RouterConfig
from policies.algorithm import AlgorithmConfig
from policies.requirements import needs_reference
from slime_async.config.loader import Schema, load_config
from slime_async.config.sections import CheckpointConfig, ClusterConfig
from slime_async.quiesce import leaves_engine_idle
from slime_async.routed_experts import RoutedExpertsError, model_routed_layout


@dataclass
class RunConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def validate(self) -> None:
        rollout, train = self.rollout, self.train
        self._check_global_batch_size()
        if not train.debug_train_only and not rollout.prompt_data:  # a replay needs no prompts
            raise ValueError("--prompt-data is required (a .jsonl or .parquet file of prompts)")
        if not train.debug_rollout_only and not self.trainer.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required (the HF model directory to train)")
        if self.engine.engine_type == "external" and not self.engine.rollout_external_engine_addrs:
            raise ValueError("--engine-type external needs --rollout-external-engine-addrs URL [URL ...]")
        implied = _MODE_STALENESS.get(train.train_mode)
        # A resolved config (config.yaml of a run) holds the implied value, and loads back.
        if self.buffer.max_staleness not in (None, implied) and train.train_mode != "fully-async":
            raise ValueError(f"--max-staleness applies to --train-mode fully-async, not {train.train_mode} "
                             "(sync is staleness 0, one-step-off is 1)")
        if self.buffer.buffer_capacity is not None and self.buffer.buffer_capacity < rollout.rollout_batch_size:
            raise ValueError(f"--buffer-capacity ({self.buffer.buffer_capacity}) must hold at least one step's "
                             f"groups (--rollout-batch-size {rollout.rollout_batch_size})")
        check_critic_run(self.algorithm.advantage_estimator, self.critic, loss_type=self.algorithm.loss_type,
                         debug_rollout_only=train.debug_rollout_only, debug_train_only=train.debug_train_only)
        if train.colocate:
            self._check_colocate()
        if self.engine.rollout_share_trainer_gpus:
            self._check_share_trainer_gpus()
        check_opd(self)
        if self.algorithm.advantage_estimator == "ppo" and self.trainer.actor_num_nodes > 1:
            raise ValueError("--actor-num-nodes > 1 with --advantage-estimator ppo: PPO's critic group runs on "
                             "the head's node only (not yet across nodes)")

    def preflight(self) -> None:
        preflight_opd(self)
        if self.rollout.use_rollout_routing_replay and self.trainer.hf_checkpoint:
            try:
                layout = model_routed_layout(self.trainer.hf_checkpoint)
            except RoutedExpertsError as error:
                raise ValueError(f"--use-rollout-routing-replay: {error}") from None
            if layout is None:
                raise ValueError(f"--use-rollout-routing-replay: --hf-checkpoint {self.trainer.hf_checkpoint} is not a "
                                 "mixture-of-experts model (Qwen3-MoE, GLM-4.5) whose experts could be replayed")

    def _check_colocate(self) -> None:
        """--colocate puts every engine TP worker on a trainer rank's device: the same number of each."""
        engine, trainer = self.engine, self.trainer
        if engine.engine_type == "external":
            raise ValueError("--colocate with --engine-type external: the run must own the engines it tells to "
                             "release their memory")
        if self.algorithm.advantage_estimator == "ppo":
            raise ValueError("--colocate with --advantage-estimator ppo: the critic's group has no device of its own "
                             "to offload to (not yet supported)")
        pp = trainer.megatron.get("pipeline_model_parallel_size", 1)
        if pp > 1:
            raise ValueError(f"--colocate with --pipeline-model-parallel-size {pp}: the engine's TP workers open "
                             "the full weights of the trainer rank on their device, which a pipeline stage lacks")
        import torch  # here, not at the top: `slime-async train --help` imports this module and not torch

        if engine.engine_type == "sglang" or (engine.engine_type == "auto" and torch.cuda.is_available()):
            if not engine.sglang.get("enable_memory_saver"):
                raise ValueError("--colocate with SGLang engines needs --sglang-enable-memory-saver: without it "
                                 "/release_memory_occupation frees nothing")
            trainer_gpus = trainer.actor_num_gpus_per_node * trainer.actor_num_nodes
            if trainer_gpus != engine.rollout_num_gpus:
                raise ValueError(f"--colocate: the trainer's GPUs (--actor-num-gpus-per-node × --actor-num-nodes = "
                                 f"{trainer_gpus}) must be the engines' (--rollout-num-gpus {engine.rollout_num_gpus}):"
                                 " each engine TP worker shares a trainer rank's GPU")

    def _check_share_trainer_gpus(self) -> None:
        """--rollout-share-trainer-gpus places engines this run launches with SGLang, resident beside
        the trainer's ranks: a transport that needs them in one NCCL group cannot work there."""
        engine, train = self.engine, self.train
        if engine.engine_type in ("cpu", "external"):
            raise ValueError(f"--rollout-share-trainer-gpus with --engine-type {engine.engine_type}: it places the "
                             "SGLang engines this run launches on the trainer's GPUs")
        if train.colocate:
            raise ValueError("--rollout-share-trainer-gpus with --colocate: colocated engines already take the "
                             "trainer's GPUs (and release them while it trains); use one of the two")
        if train.update_weight_transport == "distributed":
            raise ValueError("--rollout-share-trainer-gpus with --update-weight-transport distributed: an engine and "
                             "a trainer rank on one GPU cannot be in one NCCL group; use disk or tensor")

    def _check_global_batch_size(self) -> None:
        """--num-steps-per-rollout sets --global-batch-size (as in slime); both must split a rollout
        evenly, and a global batch must split evenly over DP ranks × --micro-batch-size."""
        rollout, trainer = self.rollout, self.trainer
        samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
        rollout_flags = f"--rollout-batch-size × --n-samples-per-prompt ({samples})"
        steps = trainer.num_steps_per_rollout
        if steps is not None:
            if steps < 1 or samples % steps != 0:
                raise ValueError(f"{rollout_flags} must be a multiple of --num-steps-per-rollout ({steps})")
            if trainer.global_batch_size is not None and trainer.global_batch_size != samples // steps:
                raise ValueError(f"--global-batch-size ({trainer.global_batch_size}) disagrees with {rollout_flags} "
                                 f"/ --num-steps-per-rollout ({steps}) = {samples // steps}; set only one")
        gbs = self._global_batch_size()
        if gbs is None:
            return
        if gbs < 1 or samples % gbs != 0:
            raise ValueError(f"{rollout_flags} must be a multiple of --global-batch-size ({gbs})")
        import torch  # here, not at the top: `slime-async train --help` imports this module and not torch

        dp = trainer.data_parallel_size(torch.cuda.is_available())
        if trainer.micro_batch_size is not None and gbs % (trainer.micro_batch_size * dp) != 0:
            raise ValueError(f"--global-batch-size ({gbs}) must be a multiple of --micro-batch-size "
                             f"({trainer.micro_batch_size}) × data-parallel ranks ({dp})")
        if gbs < dp:  # a token budget (--max-tokens-per-gpu) only needs a sample per DP rank
            raise ValueError(f"--global-batch-size ({gbs}) must be at least the data-parallel ranks ({dp})")

    def _global_batch_size(self) -> int | None:
        steps = self.trainer.num_steps_per_rollout
        if steps is None:
            return self.trainer.global_batch_size
        return self.rollout.rollout_batch_size * self.rollout.n_samples_per_prompt // steps

    def resolve(self) -> RunConfig:
        """The finished config: each value derived from other flags, computed here once, after
        ``validate``. Idempotent, so a resolved config (the run's config.yaml) loads back to itself."""
        train = self.train
        # The bound the buffer enforces: sync 0, one-step-off 1, fully-async the flag (None: unbounded).
        # Without training the policy never changes: only capacity paces a rollout-only run.
        max_staleness = None if train.debug_rollout_only else _MODE_STALENESS.get(train.train_mode,
                                                                                   self.buffer.max_staleness)
        router_timeout = self.router.router_request_timeout
        return replace(
            self,
            buffer=replace(self.buffer, max_staleness=max_staleness, buffer_capacity=(
                self.buffer.buffer_capacity or default_capacity(max_staleness, self.groups_per_version))),
            trainer=replace(self.trainer, global_batch_size=self._global_batch_size(),
                            use_reference=self.trainer.use_reference or needs_reference(self.algorithm),
                            use_rollout_routing_replay=self.rollout.use_rollout_routing_replay),
            router=replace(self.router, router_request_timeout=(
                self.engine.engine_request_timeout if router_timeout is None else router_timeout),
                # Per-token versions from the engines' streams where a request can span an update.
                router_stream_generate=(not leaves_engine_idle(train.weight_update_mode)
                                        if self.router.router_stream_generate is None
                                        else self.router.router_stream_generate)),
            # R3: the engines the run starts record the experts (SGLang's server arg; the CPU engine's flag).
            engine=replace(self.engine, sglang={**self.engine.sglang, ROUTED_EXPERTS_ARG: True})
            if self.rollout.use_rollout_routing_replay else self.engine,
            # Unset: disk, or IPC handles (tensor) for colocated weights; an explicit choice stays.
            train=replace(train, update_weight_transport=train.update_weight_transport or (
                "tensor" if train.colocate else "disk")),
        )

    @property
    def groups_per_version(self) -> int:
        """The groups the buffer's admission rule counts per policy version (G of
        ``policies.staleness``): a sync every N steps consumes N steps' groups, and over-sampling
        admits more groups per version than a step trains, so groups the dynamic filter drops are
        already replaced (surplus that outlives the bound is dropped as stale)."""
        r = self.rollout
        return (r.over_sampling_batch_size or r.rollout_batch_size) * self.train.update_weights_interval


# The staleness each mode implies; fully-async takes --max-staleness.
_MODE_STALENESS = {"sync": 0, "one-step-off": 1}


def _megatron_extra() -> tuple[type, ...]:
    from actors.megatron.model_flags import MegatronLMModelFlags
    from actors.megatron.options import ScheduleConfig

    return ScheduleConfig, MegatronLMModelFlags


SCHEMA = Schema(RunConfig, megatron_section="trainer", sglang_section="engine", megatron_extra=_megatron_extra,
                sglang_owned=RUNTIME_OWNED_SGLANG_FIELDS)


def parse_run_config(argv: list[str]) -> RunConfig:
    """The validated, resolved config of ``slime-async train ARGV``."""
    return load_config(SCHEMA, argv, prog="slime-async train",
                       description="RL training: rollout on SGLang / CPU engines, Megatron-core trainer ranks.").resolve()
