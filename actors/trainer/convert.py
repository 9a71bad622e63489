"""``slime-async convert``: HF checkpoint <-> Megatron distributed checkpoint.

    slime-async convert hf-to-megatron --hf-checkpoint DIR --save DIR [--tensor-model-parallel-size N]
    slime-async convert megatron-to-hf --load DIR --save DIR [--tensor-model-parallel-size N]

Each command launches ``torchrun --nproc-per-node N`` (gloo on CPU, NCCL on GPU) running this
module's worker. The Megatron side is a ``megatron.core.dist_checkpointing`` checkpoint of the
model's sharded state dict, so it loads at any TP. Layout of a Megatron checkpoint dir:

    DIR/model/      dist_checkpointing files
    DIR/hf/         config.json, generation config, tokenizer files of the source HF model
                    (megatron-to-hf rebuilds the model from them and copies them to the output)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from slime_async.child_env import child_env
from slime_async.net import free_port

MODEL_SUBDIR = "model"
HF_METADATA_SUBDIR = "hf"


def hf_to_megatron(hf_checkpoint: str | Path, save_dir: str | Path, tp: int = 1) -> None:
    """Convert an HF directory into a Megatron distributed checkpoint (runs ``tp`` ranks)."""
    if not (Path(hf_checkpoint) / "config.json").exists():
        raise FileNotFoundError(f"--hf-checkpoint {hf_checkpoint} has no config.json; is it an HF model directory?")
    _launch(tp, ["hf-to-megatron", "--hf-checkpoint", str(hf_checkpoint), "--save", str(save_dir)])


def megatron_to_hf(load_dir: str | Path, save_dir: str | Path, tp: int = 1) -> None:
    """Convert a checkpoint written by ``hf_to_megatron`` back into an HF directory."""
    _check_megatron_dir(Path(load_dir))
    _launch(tp, ["megatron-to-hf", "--load", str(load_dir), "--save", str(save_dir)])


def _launch(tp: int, worker_args: list[str]) -> None:
    if tp < 1:
        raise ValueError(f"--tensor-model-parallel-size must be >= 1, got {tp}")
    cmd = [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(tp),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "actors.trainer.convert", "--worker", *worker_args,
        "--tensor-model-parallel-size", str(tp),
    ]
    proc = subprocess.run(cmd, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(
            f"convert {worker_args[0]} failed: torchrun exited with {proc.returncode} "
            f"(command: {' '.join(cmd)}); the ranks' errors are in the output above"
        )


def _check_megatron_dir(load_dir: Path) -> None:
    if not (load_dir / HF_METADATA_SUBDIR / "config.json").exists() or not (load_dir / MODEL_SUBDIR).is_dir():
        raise FileNotFoundError(
            f"--load {load_dir} is not a checkpoint written by `convert hf-to-megatron` "
            f"(expected {MODEL_SUBDIR}/ and {HF_METADATA_SUBDIR}/config.json inside it)"
        )


def _worker_hf_to_megatron(hf_checkpoint: Path, save_dir: Path, tp: int) -> None:
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from actors.megatron.bridge import copy_hf_metadata
    from actors.megatron.model import build_gpt_model
    from actors.megatron.parallel import destroy_model_parallel, init_model_parallel

    init_model_parallel(tensor_parallel_size=tp)
    model = build_gpt_model(hf_checkpoint, {}, load_weights=True)
    if dist.get_rank() == 0:
        (save_dir / MODEL_SUBDIR).mkdir(parents=True, exist_ok=True)
        copy_hf_metadata(hf_checkpoint, save_dir / HF_METADATA_SUBDIR)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), str(save_dir / MODEL_SUBDIR))
    destroy_model_parallel()


def _worker_megatron_to_hf(load_dir: Path, save_dir: Path, tp: int) -> None:
    from megatron.core import dist_checkpointing

    from actors.megatron.bridge import save_hf_checkpoint
    from actors.megatron.model import build_gpt_model
    from actors.megatron.parallel import destroy_model_parallel, init_model_parallel

    _check_megatron_dir(load_dir)
    hf_meta = load_dir / HF_METADATA_SUBDIR
    init_model_parallel(tensor_parallel_size=tp)
    model = build_gpt_model(hf_meta, {})
    state = dist_checkpointing.load(model.sharded_state_dict(), str(load_dir / MODEL_SUBDIR))
    model.load_state_dict(state)
    save_hf_checkpoint(model, hf_meta, save_dir)
    destroy_model_parallel()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="slime-async convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True)
    to_megatron = commands.add_parser("hf-to-megatron", help="HF dir -> Megatron distributed checkpoint")
    to_megatron.add_argument("--hf-checkpoint", type=Path, required=True)
    to_megatron.add_argument("--save", type=Path, required=True)
    to_hf = commands.add_parser("megatron-to-hf", help="Megatron checkpoint -> HF dir")
    to_hf.add_argument("--load", type=Path, required=True)
    to_hf.add_argument("--save", type=Path, required=True)
    for sub in (to_megatron, to_hf):
        sub.add_argument("--tensor-model-parallel-size", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``slime-async convert ...`` (``argv`` excludes the word ``convert``)."""
    args = _parser().parse_args(argv)
    tp = args.tensor_model_parallel_size
    if args.command == "hf-to-megatron":
        if args.worker:
            _worker_hf_to_megatron(args.hf_checkpoint, args.save, tp)
        else:
            hf_to_megatron(args.hf_checkpoint, args.save, tp)
    else:
        if args.worker:
            _worker_megatron_to_hf(args.load, args.save, tp)
        else:
            megatron_to_hf(args.load, args.save, tp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
