"""The trainer side of a distributed weight update, as its own process.

Run by the contract suite: joins the weight-update group as rank 0 (the engine's ranks are
1..world_size-1), broadcasts every tensor of an HF safetensors checkpoint in file order,
waits for stdin to close, then exits 0. The first stdout line is the announcement the engine gets over HTTP:
{"names": [...], "dtypes": [...], "shapes": [...]}.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from slime_async.weights.process_group import destroy_custom_process_group, init_custom_process_group


def load_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if not tensors:
        raise SystemExit(f"no *.safetensors in {model_dir}")
    return tensors


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--init-method", required=True)  # tcp://127.0.0.1:PORT
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--group-name", required=True)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="give up joining or broadcasting after this")
    args = parser.parse_args()

    tensors = load_checkpoint(args.model_dir)
    announcement = {
        "names": list(tensors),
        "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors.values()],
        "shapes": [list(t.shape) for t in tensors.values()],
    }
    print(json.dumps(announcement), flush=True)

    device = "cuda" if args.backend == "nccl" else "cpu"
    group = init_custom_process_group(
        args.backend, args.init_method, args.world_size, 0, args.group_name, timeout=timedelta(seconds=args.timeout_s)
    )
    print(f"joined {args.group_name} ({args.backend}); broadcasting {len(tensors)} tensors", file=sys.stderr, flush=True)
    for tensor in tensors.values():
        dist.broadcast(tensor.to(device).contiguous(), src=0, group=group)
    if device == "cuda":
        torch.cuda.synchronize()
    print("broadcast sent", file=sys.stderr, flush=True)
    # Stay in the group until the test has seen the engine finish receiving (it closes our
    # stdin): leaving early could reset connections that still carry the last tensors.
    sys.stdin.read()
    destroy_custom_process_group(group)
    print("broadcast done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
