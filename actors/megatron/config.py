"""`TrainerConfig`: the trainer section of the run config (slime flag names as field names), and
the config of every Megatron group (the critic's is derived from it: `actors.critic.config`).

``megatron`` is the pass-through: a dict of megatron-core ``TransformerConfig`` /
``OptimizerConfig`` / ``DistributedDataParallelConfig`` field -> value (filled by the CLI from
flags generated from those dataclasses), plus the LR-schedule keys of
``actors.megatron.options.ScheduleConfig``. The worker routes each key to every dataclass that
has the field; an unknown key fails at start with its name.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal


@dataclass
class TrainerConfig:
    hf_checkpoint: str = field(
        default="", metadata={"help": "HF model directory: architecture, initial weights and tokenizer"}
    )
    actor_num_nodes: int = field(default=1, metadata={"help": "nodes of the training group (torchrun --nnodes): the "
                                 "head and --actor-num-nodes - 1 nodes running `slime-async agent` (docs/multi-node.md)"})
    actor_num_gpus_per_node: int = field(
        default=1, metadata={"help": "training ranks per node on GPU (torchrun --nproc-per-node)"}
    )
    actor_num_procs: int = field(
        default=1, metadata={"help": "training ranks on CPU (no GPU): torchrun --nproc-per-node"}
    )
    max_tokens_per_gpu: int | None = field(
        default=8192,
        metadata={"help": "token budget of one micro-batch (padded tokens); --micro-batch-size replaces it"},
    )
    micro_batch_size: int | None = field(
        default=None, metadata={"help": "fixed samples per micro-batch, instead of the --max-tokens-per-gpu budget"}
    )
    global_batch_size: int | None = field(
        default=None, metadata={"help": "samples per optimizer step: a rollout of R samples takes R / "
                                "global_batch_size optimizer steps (unset: one step per rollout)"}
    )
    num_steps_per_rollout: int | None = field(
        default=None, metadata={"help": "optimizer steps per rollout (slime's flag): sets --global-batch-size "
                                "to rollout-batch-size x n-samples-per-prompt / this"}
    )
    ref_load: str | None = field(
        default=None,
        metadata={"help": "HF directory of the frozen reference model (unset: the initial --hf-checkpoint weights)"},
    )
    use_reference: bool = field(
        default=False,
        metadata={"help": "keep a frozen reference model (--ref-load, else the initial weights); on by itself when "
                                "--use-kl-loss or --kl-coef needs one"},
    )
    opd_teacher_load: str | None = field(
        default=None,
        metadata={"help": "--opd-type megatron: the frozen teacher the trainer ranks forward, an HF directory or "
                          "a Megatron checkpoint (a --save step directory or its trainer/), of the policy's "
                          "architecture"},
    )
    seed: int = field(default=1234, metadata={"help": "random seed of the training ranks"})
    trainer_start_timeout: float = field(
        default=300.0, metadata={"help": "seconds for the ranks to build the model and join the RPC group"}
    )
    op_timeout: float = field(
        default=3600.0, metadata={"help": "seconds one trainer operation (train_step, save, ...) may take"}
    )
    weight_bucket_mb: float = field(
        default=512.0, metadata={"help": "bucket size of distributed weight updates, in MiB"}
    )
    use_sdpa: bool | None = field(
        default=None, metadata={"help": "SDPA core attention (default: on with CUDA, off on CPU)"}
    )
    attention_impl: Literal["auto", "loop", "varlen"] = field(default="auto", metadata={
        "help": "packed-sequence attention: one varlen call (flash kernel on CUDA, else a block-diagonal mask) or "
        "a loop per sequence; auto: the loop over right-padded micro-batches (measured faster on an H200 and on "
        "CPU); varlen packs the micro-batches"})
    logprob_impl: Literal["auto", "full", "chunked"] = field(default="auto", metadata={
        "help": "logprobs/entropy from full [tokens x vocab] logits, or chunked from the hidden states (the logits "
        "never whole, recomputed in the backward: less memory, ~12% slower on an H200); auto: full"})
    log_probs_chunk_size: int = field(default=-1, metadata={
        "help": "tokens per chunk of the chunked logprob head (slime's flag); -1: sized by a 2^26-element budget"})
    master_port: int | None = field(default=None, metadata={"help": "torchrun rendezvous port (None: a free one)"})
    trainer_num_threads: int = field(default=0, metadata={
        "help": "torch threads per CPU rank (OMP_NUM_THREADS); 0 = torch's default. On a small CPU machine, "
        "leave cores to the engines so generation and training can overlap"})
    train_step_delay: float = field(default=0.0, metadata={
        "help": "seconds each train step waits after its update (benchmarks only: a trainer slower than "
        "generation lets fully-async runs reach --max-staleness; benchmarks/staleness_ablation.py)"})
    # R3 (rollout routing replay): not a flag of its own. The one flag, --use-rollout-routing-replay, is
    # the rollout section's (the engines' side); RunConfig.resolve copies it here for the ranks.
    use_rollout_routing_replay: bool = field(default=False, metadata={"flag": False})
    megatron: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "megatron-core TransformerConfig/OptimizerConfig/DDP config fields (pass-through)"},
    )

    def validate(self) -> TrainerConfig:
        if not self.hf_checkpoint:
            raise ValueError("--hf-checkpoint is required for the trainer")
        for name in ("micro_batch_size", "global_batch_size", "max_tokens_per_gpu"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        if self.micro_batch_size is not None:
            # A fixed micro-batch size replaces the (default) token budget.
            self.max_tokens_per_gpu = None
        if self.max_tokens_per_gpu is None and self.micro_batch_size is None:
            raise ValueError("set one of --max-tokens-per-gpu and --micro-batch-size")
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "actor_num_procs"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name, allowed in (("attention_impl", ("auto", "loop", "varlen")),
                              ("logprob_impl", ("auto", "full", "chunked"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.log_probs_chunk_size == 0 or self.log_probs_chunk_size < -1:
            raise ValueError(f"--log-probs-chunk-size must be > 0 or -1, got {self.log_probs_chunk_size}")
        if self.train_step_delay < 0:
            raise ValueError(f"--train-step-delay must be >= 0, got {self.train_step_delay}")
        from actors.megatron.model_flags import check_model_flags
        # megatron-core: imported by a check only when the flags given need it
        from actors.megatron.options import check_megatron_options, split_megatron_overrides
        from actors.megatron.pipeline import check_pipeline_layout

        check_megatron_options(self.megatron)
        check_model_flags(self.megatron, self.hf_checkpoint)
        transformer = split_megatron_overrides(self.megatron).transformer
        check_pipeline_layout(transformer, self.hf_checkpoint)
        from actors.megatron.moe_layout import check_moe_layout, check_routing_replay
        check_moe_layout(transformer, self.hf_checkpoint, self.num_ranks(torch_cuda()) * self.actor_num_nodes)
        if self.use_rollout_routing_replay:
            check_routing_replay(transformer, self.hf_checkpoint)
        return self

    def preflight(self) -> None:
        """The model directories exist and hold what the trainer and engines load (checked at start)."""
        from slime_async.config.paths import require_hf_model_dir

        if self.hf_checkpoint:
            require_hf_model_dir(self.hf_checkpoint, "--hf-checkpoint")
        if self.ref_load:
            require_hf_model_dir(self.ref_load, "--ref-load", tokenizer=False)
        if self.opd_teacher_load:
            from slime_async.config.paths import require_dir

            require_dir(self.opd_teacher_load, "--opd-teacher-load")

    def num_ranks(self, cuda: bool) -> int:
        """Training ranks per node: GPUs with CUDA, processes without."""
        return self.actor_num_gpus_per_node if cuda else self.actor_num_procs

    def data_parallel_size(self, cuda: bool) -> int:
        """DP ranks: all training ranks over TP × PP (from the Megatron pass-through)."""
        model_parallel = (self.megatron.get("tensor_model_parallel_size", 1)
                          * self.megatron.get("pipeline_model_parallel_size", 1))
        return max(1, self.num_ranks(cuda) * self.actor_num_nodes // model_parallel)

    def with_absolute_paths(self) -> TrainerConfig:
        """This config with its checkpoint paths resolved against the current directory."""
        absolute = {name: str(Path(value).resolve()) for name in ("hf_checkpoint", "ref_load", "opd_teacher_load")
                    if (value := getattr(self, name))}
        return replace(self, **absolute)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=_json_default)

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        data = json.loads(text)
        return cls(**data)


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _json_default(value: Any) -> Any:
    # torch dtypes can appear in the pass-through (params_dtype); they travel by name.
    text = str(value)
    if text.startswith("torch."):
        return text
    raise TypeError(f"trainer config value {value!r} ({type(value).__name__}) is not JSON-serialisable")
