"""Command line and start-up checks of the CPU engine process.

Kept free of torch/transformers imports so that a wrong flag or model path fails within a
fraction of a second instead of after seconds of imports.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from actors.engine.cpu.preconditions import strict_from_env

DTYPES = ("float32", "bfloat16", "float16")


class ModelDirError(ValueError):
    """The model directory is missing or not an HF causal LM checkpoint."""


@dataclass
class EngineArgs:
    """Options of one CPU engine server."""

    model_path: str
    host: str = "127.0.0.1"
    port: int = 30000  # 0 picks a free port, printed at start
    max_running_requests: int = 32
    # Tokens reserved by the running batch: sum of (prompt + max_new_tokens) per request.
    max_total_tokens: int = 65536
    prefix_cache_max_tokens: int = 32768
    seed: int = 0
    num_threads: int = 1  # engine and trainer share few cores on CI
    dtype: str = "float32"
    weight_version: str = "default"
    # meta_info.weight_version_segments (which version produced which output tokens) in every
    # answer; off, the answers are SGLang's, which only name the version when each was built.
    weight_version_segments: bool = True
    # SGLang's server arg: each stream chunk holds only its new tokens (default: everything so far).
    incremental_streaming_output: bool = False
    # SGLang's server arg: record each forward's experts per MoE layer for return_routed_experts.
    enable_return_routed_experts: bool = False
    # A control request SGLang 0.5.17 dies on: exit as it does (True) or refuse it with HTTP 400.
    strict_sglang_preconditions: bool = False

    def validate(self) -> None:
        check_model_dir(self.model_path)
        if self.max_running_requests < 1:
            raise ValueError(f"--max-running-requests must be at least 1, got {self.max_running_requests}")
        if self.max_total_tokens < 1:
            raise ValueError(f"--max-total-tokens must be at least 1, got {self.max_total_tokens}")
        if self.prefix_cache_max_tokens < 0:
            raise ValueError(f"--prefix-cache-max-tokens must be >= 0, got {self.prefix_cache_max_tokens}")
        if self.num_threads < 1:
            raise ValueError(f"--num-threads must be at least 1, got {self.num_threads}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")


def check_model_dir(path: str | Path) -> Path:
    """Fail early, naming the path, when `path` cannot hold an HF causal LM."""
    p = Path(path)
    if not p.is_dir():
        raise ModelDirError(f"model path {str(p)!r} does not exist or is not a directory")
    if not (p / "config.json").is_file():
        raise ModelDirError(f"model path {str(p)!r} has no config.json; expected an HF-format model directory")
    if not list(p.glob("*.safetensors")) and not list(p.glob("*.bin")):
        raise ModelDirError(f"model path {str(p)!r} has no *.safetensors or *.bin weight files")
    return p


def parse_args(argv: list[str] | None) -> EngineArgs:
    defaults = EngineArgs(model_path="")
    parser = argparse.ArgumentParser(
        prog="slime-async serve-engine", description="Serve an HF causal LM on CPU with SGLang's HTTP API."
    )
    parser.add_argument("--model-path", required=True, help="HF-format model directory")
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument("--port", type=int, default=defaults.port, help="0 picks a free port (printed at start)")
    parser.add_argument("--max-running-requests", type=int, default=defaults.max_running_requests)
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=defaults.max_total_tokens,
        help="token budget of the running batch (prompt + max_new_tokens per request)",
    )
    parser.add_argument("--prefix-cache-max-tokens", type=int, default=defaults.prefix_cache_max_tokens)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--num-threads", type=int, default=defaults.num_threads, help="torch intra-op threads")
    parser.add_argument("--dtype", default=defaults.dtype, choices=DTYPES)
    parser.add_argument("--weight-version", default=defaults.weight_version)
    parser.add_argument("--no-weight-version-segments", dest="weight_version_segments", action="store_false",
                        help="answer exactly like SGLang: no meta_info.weight_version_segments (the version of "
                             "each output token); a stream's chunks still name the version each was built under")
    parser.add_argument("--incremental-streaming-output", action="store_true",
                        help="SGLang's flag: each chunk of a streamed /generate holds only its new tokens")
    parser.add_argument("--enable-return-routed-experts", action="store_true",
                        help="SGLang's flag: record the top-k experts every MoE layer used at every position, for "
                             "/generate requests with return_routed_experts (meta_info.routed_experts); an MoE "
                             "model only")
    parser.add_argument(
        "--strict-sglang-preconditions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on a control request SGLang 0.5.17's scheduler dies on (a flushing weight update or a memory "
        "release while requests run or wait, a resume of memory not released, an unknown weights update group: "
        "actors/engine/cpu/preconditions.py), log SGLang's error and exit with code 70 as SGLang's server dies, "
        "instead of refusing it with HTTP 400; default: $SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS (1 or 0, "
        "the test suite sets 1), else off",
    )
    parsed = parser.parse_args(argv)
    if parsed.strict_sglang_preconditions is None:
        try:
            parsed.strict_sglang_preconditions = strict_from_env()
        except ValueError as exc:
            parser.error(str(exc))
    return EngineArgs(**vars(parsed))
