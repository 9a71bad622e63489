"""The `engine` config section: which engines serve rollouts and how the runtime talks to them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from slime_async.config.flags import field_help as _help

EngineType = Literal["auto", "sglang", "cpu", "external"]

# Fields the runtime sets on every engine it launches, and the flag (or mechanism) that sets
# each one. The config validator rejects `--sglang-<field>` for these, naming the flag to use.
# Defined here rather than in sglang.py (which uses it) so that the config, and with it
# `slime-async train --help`, does not import the process layer (aiohttp).
RUNTIME_OWNED_SGLANG_FIELDS: dict[str, str] = {
    "model_path": "--hf-checkpoint (the policy the trainer serves)",
    "host": "--engine-host",
    "port": "--engine-base-port (one port per engine)",
    "tp_size": "--rollout-num-gpus-per-engine",
    "base_gpu_id": "--rollout-num-gpus / --rollout-num-gpus-per-engine (GPU assignment)",
    "nccl_port": "the runtime (a free port per engine)",
    "dist_init_addr": "the runtime (single-node engines)",
    "skip_tokenizer_init": "the runtime (it always sends token ids)",
}

# SGLang's server arg that records each MoE layer's experts (--use-rollout-routing-replay sets it):
# the policy's engines take it, a teacher (maybe dense, never asked for them) does not.
ROUTED_EXPERTS_ARG = "enable_return_routed_experts"


@dataclass
class EngineConfig:
    engine_type: EngineType = field(
        default="auto",
        metadata=_help(
            "what serves rollouts: sglang = launch SGLang servers on the rollout GPUs; cpu = the embedded "
            "CPU engine; external = the servers of --rollout-external-engine-addrs; auto = external when "
            "addresses are given, else sglang when a GPU and sglang are present, else cpu"
        ),
    )
    rollout_num_gpus: int = field(default=1, metadata=_help("GPUs given to SGLang engines (sglang only)"))
    rollout_num_gpus_per_engine: int = field(
        default=1, metadata=_help("GPUs per SGLang engine, i.e. its tensor-parallel size (sglang only)")
    )
    rollout_share_trainer_gpus: bool = field(default=False, metadata=_help(
        "SGLang engines start on the trainer's GPUs (from GPU 0) and stay resident beside its ranks, without "
        "--colocate's release and offload: a one-GPU host. Leave the trainer room with --sglang-mem-fraction-static "
        "(e.g. 0.35); weights move by disk or tensor (IPC), not distributed (one NCCL group cannot hold an engine "
        "and a trainer rank on one GPU)"))
    rollout_num_engines: int = field(default=1, metadata=_help("number of embedded CPU engines (cpu only)"))
    rollout_num_nodes: int = field(default=1, metadata=_help(
        "nodes the owned engines are spread over, the head's first (more than 1: the others run `slime-async "
        "agent`); with sglang, --rollout-num-gpus is per node; cpu engines go round-robin"))
    rollout_external_engine_addrs: list[str] = field(
        default_factory=list,
        metadata=_help("URLs (or host:port) of already-running SGLang-compatible servers; never started or killed"),
    )
    engine_api_key: str | None = field(
        default=None,
        metadata=_help("sent as 'Authorization: Bearer <key>' to every engine (for servers started with --api-key)"),
    )
    engine_host: str = field(default="127.0.0.1", metadata=_help("address owned engines listen on"))
    engine_base_port: int = field(
        default=0,
        metadata=_help("port of the first owned engine, the next ones use the following ports; 0 = a free port each"),
    )
    engine_start_timeout: float = field(
        default=600.0, metadata=_help("seconds an owned engine may take until /health_generate answers")
    )
    engine_request_timeout: float = field(
        default=600.0, metadata=_help("seconds one /generate call to an engine may take before it counts as failed "
                                            "(the default of --router-request-timeout)")
    )
    cpu_engine_max_running_requests: int = field(
        default=32, metadata=_help("requests the CPU engine batches together; more wait in its queue")
    )
    cpu_engine_threads: int = field(default=0, metadata=_help("torch threads per CPU engine; 0 = torch's default"))
    cpu_engine_strict_preconditions: bool = field(default=False, metadata=_help(
        "CPU engines exit, as SGLang 0.5.17's server dies, on a control request SGLang's scheduler asserts on "
        "(e.g. a flushing weight update while requests run) instead of refusing it with HTTP 400; off: the "
        "engine's own default ($SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS, which the test suite sets)"))
    opd_teacher_hf_checkpoint: str | None = field(default=None, metadata=_help(
        "--opd-type sglang: HF directory of the teacher; the run starts and supervises one engine of it (the "
        "engine type of the policy's, on the next GPU for SGLang), never routed student traffic, never synced"))
    opd_teacher_url: str | None = field(default=None, metadata=_help(
        "--opd-type sglang: URL of an already-running SGLang-compatible server of the teacher (instead of "
        "--opd-teacher-hf-checkpoint); never started or killed"))
    # Filled from --sglang-<field> flags and the [sglang] table by the config loader; forwarded
    # verbatim to sglang.launch_server (not a flag itself).
    sglang: dict[str, object] = field(default_factory=dict, metadata=_help("SGLang ServerArgs pass-through values"))

    def resolved_engine_type(self, gpu_available: bool, sglang_available: bool) -> str:
        """ "auto" made concrete for this machine; other values are returned as they are."""
        if self.engine_type != "auto":
            return self.engine_type
        if self.rollout_external_engine_addrs:
            return "external"
        return "sglang" if gpu_available and sglang_available else "cpu"

    def validate(self) -> None:
        if self.engine_type not in ("auto", "sglang", "cpu", "external"):
            raise ValueError(f"--engine-type must be auto, sglang, cpu or external, got {self.engine_type!r}")
        if self.engine_type == "external" and not self.rollout_external_engine_addrs:
            raise ValueError("--engine-type external needs --rollout-external-engine-addrs")
        if self.rollout_external_engine_addrs and self.engine_type in ("sglang", "cpu"):
            raise ValueError(
                f"--rollout-external-engine-addrs is only used with --engine-type external or auto, "
                f"not {self.engine_type}"
            )
        for address in self.rollout_external_engine_addrs:
            if not address.strip():
                raise ValueError("--rollout-external-engine-addrs contains an empty address")
        if self.rollout_num_gpus_per_engine < 1:
            raise ValueError(f"--rollout-num-gpus-per-engine must be >= 1, got {self.rollout_num_gpus_per_engine}")
        if self.rollout_num_gpus < 1:
            raise ValueError(f"--rollout-num-gpus must be >= 1, got {self.rollout_num_gpus}")
        if self.rollout_num_gpus % self.rollout_num_gpus_per_engine:
            raise ValueError(
                f"--rollout-num-gpus ({self.rollout_num_gpus}) must be a multiple of "
                f"--rollout-num-gpus-per-engine ({self.rollout_num_gpus_per_engine})"
            )
        if self.rollout_num_engines < 1:
            raise ValueError(f"--rollout-num-engines must be >= 1, got {self.rollout_num_engines}")
        if self.rollout_num_nodes < 1:
            raise ValueError(f"--rollout-num-nodes must be >= 1, got {self.rollout_num_nodes}")
        if not self.engine_host:
            raise ValueError("--engine-host must not be empty")
        if not 0 <= self.engine_base_port <= 65535:
            raise ValueError(f"--engine-base-port must be 0 (free ports) or a port number, got {self.engine_base_port}")
        if self.engine_base_port:
            engines = max(self.rollout_num_engines, self.rollout_num_gpus // self.rollout_num_gpus_per_engine)
            if self.engine_base_port + engines - 1 > 65535:
                raise ValueError(f"--engine-base-port {self.engine_base_port} leaves no room for {engines} engines")
        if self.engine_start_timeout <= 0:
            raise ValueError(f"--engine-start-timeout must be > 0, got {self.engine_start_timeout}")
        if self.engine_request_timeout <= 0:
            raise ValueError(f"--engine-request-timeout must be > 0, got {self.engine_request_timeout}")
        if self.cpu_engine_max_running_requests < 1:
            raise ValueError(
                f"--cpu-engine-max-running-requests must be >= 1, got {self.cpu_engine_max_running_requests}"
            )
        if self.cpu_engine_threads < 0:
            raise ValueError(f"--cpu-engine-threads must be >= 0, got {self.cpu_engine_threads}")
        if self.opd_teacher_hf_checkpoint and self.opd_teacher_url:
            raise ValueError("--opd-teacher-hf-checkpoint and --opd-teacher-url exclude each other: the teacher is "
                             "an engine this run starts, or one already running")
        if self.opd_teacher_url is not None and not self.opd_teacher_url.strip():
            raise ValueError("--opd-teacher-url must not be empty")
        owned = sorted(set(self.sglang) & set(RUNTIME_OWNED_SGLANG_FIELDS))
        if owned:
            name = owned[0]
            raise ValueError(
                f"--sglang-{name.replace('_', '-')} is set by the runtime, not passed through: use "
                f"{RUNTIME_OWNED_SGLANG_FIELDS[name]}"
            )
        if self.sglang and self.engine_type in ("cpu", "external"):
            first = next(iter(self.sglang)).replace("_", "-")
            raise ValueError(
                f"--sglang-{first} only applies to engines this run launches with SGLang, "
                f"not to --engine-type {self.engine_type}"
            )
