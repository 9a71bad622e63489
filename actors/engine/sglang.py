"""Launch SGLang servers as process children.

The runtime owns the flags that tie an engine into the run (which model, where it listens,
which GPUs it uses, that it receives token ids); every other `ServerArgs` field the user
gave as `--sglang-<field>` is forwarded verbatim, so an option a new SGLang adds works the
day it is installed. sglang itself is only needed on the machine that runs the server:
building the command line does not import it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from actors.engine.config import RUNTIME_OWNED_SGLANG_FIELDS
from slime_async.process import ProcessSpec, http_ready


def build_sglang_argv(
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    passthrough: Mapping[str, object] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The `python -m sglang.launch_server ...` command line for one engine.

    Pass-through values become flags by SGLang's own convention: `field_name` → `--field-name`;
    `True` → a bare switch; `False`/`None` → omitted (SGLang's switches default to off, so
    leaving them out is the same as "off"); a list → the flag followed by each item.
    Raises ValueError when `passthrough` names a runtime-owned field.
    """
    passthrough = dict(passthrough or {})
    owned = sorted(set(passthrough) & set(RUNTIME_OWNED_SGLANG_FIELDS))
    if owned:
        details = "; ".join(f"--sglang-{f.replace('_', '-')} is set by {RUNTIME_OWNED_SGLANG_FIELDS[f]}" for f in owned)
        raise ValueError(f"SGLang pass-through may not set runtime-owned fields: {details}")
    if port <= 0 or port > 65535:
        raise ValueError(f"engine port {port} is outside 1..65535 (see --engine-base-port)")
    argv = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(tp_size),
        "--base-gpu-id",
        str(base_gpu_id),
        # The runtime sends and receives token ids only (token in, token out), so the server
        # needs no tokenizer in its request path.
        "--skip-tokenizer-init",
    ]
    return argv + passthrough_args(passthrough)


def passthrough_args(values: Mapping[str, object]) -> list[str]:
    """`{"mem_fraction_static": 0.7, "enable_metrics": True}` → `["--mem-fraction-static", "0.7", "--enable-metrics"]`."""
    args: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            args += [flag, *(str(item) for item in value)]
        elif isinstance(value, dict):
            # SGLang reads dict-valued options (e.g. json_model_override_args) as JSON text.
            args += [flag, json.dumps(value)]
        else:
            args += [flag, str(value)]
    return args


def sglang_process_spec(
    name: str,
    model_path: str,
    *,
    host: str = "127.0.0.1",
    port: int,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    passthrough: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
    ready_timeout: float = 600.0,
    python: str = sys.executable,
) -> ProcessSpec:
    """A ProcessSpec that is ready once `/health_generate` answers 200 (the model can generate,
    not merely the HTTP server is up)."""
    argv = build_sglang_argv(
        model_path,
        host=host,
        port=port,
        tp_size=tp_size,
        base_gpu_id=base_gpu_id,
        passthrough=passthrough,
        python=python,
    )
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{probe_host}:{port}"
    return ProcessSpec(
        name=name,
        argv=argv,
        env=dict(env or {}),
        # health_generate runs a real one-token generation; allow it the time of a cold start.
        ready=http_ready(url + "/health_generate", timeout=30.0),
        ready_timeout=ready_timeout,
        ready_interval=1.0,
        stop_timeout=30.0,  # SGLang frees GPU memory in its scheduler processes on SIGTERM
    )


def assign_engine_gpus(
    rollout_num_gpus: int, rollout_num_gpus_per_engine: int, first_gpu: int = 0
) -> list[tuple[int, int]]:
    """Split the rollout GPUs into engines: one `(base_gpu_id, tp_size)` per engine.

    Example: 8 GPUs, 2 per engine, first_gpu 0 → [(0, 2), (2, 2), (4, 2), (6, 2)].
    """
    if rollout_num_gpus_per_engine < 1:
        raise ValueError(f"--rollout-num-gpus-per-engine must be >= 1, got {rollout_num_gpus_per_engine}")
    if rollout_num_gpus < 1:
        raise ValueError(f"--rollout-num-gpus must be >= 1 to launch SGLang engines, got {rollout_num_gpus}")
    if first_gpu < 0:
        raise ValueError(f"the first rollout GPU must be >= 0, got {first_gpu}")
    if rollout_num_gpus % rollout_num_gpus_per_engine:
        raise ValueError(
            f"--rollout-num-gpus ({rollout_num_gpus}) must be a multiple of "
            f"--rollout-num-gpus-per-engine ({rollout_num_gpus_per_engine})"
        )
    return [
        (first_gpu + start, rollout_num_gpus_per_engine)
        for start in range(0, rollout_num_gpus, rollout_num_gpus_per_engine)
    ]
