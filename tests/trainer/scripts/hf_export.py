"""torchrun script: load HF checkpoints at TP=world size, export each back as HF.

For each --hf-dir, in order, its --out-dir: rank 0 writes the exported checkpoint there and a
report of the weight buckets (names and byte sizes per bucket for --bucket-bytes) to
OUT_DIR/buckets.json. Several pairs share one launch (its start-up is most of its time).
"""

import argparse
import json
import os
from pathlib import Path

import torch.distributed as dist

from actors.megatron.bridge import iter_hf_weight_buckets, save_hf_checkpoint
from actors.megatron.model import build_gpt_model
from actors.megatron.parallel import destroy_model_parallel, init_model_parallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hf-dir", action="append", required=True)
    parser.add_argument("--out-dir", action="append", required=True)
    parser.add_argument("--bucket-bytes", type=int, required=True)
    args = parser.parse_args()
    if len(args.hf_dir) != len(args.out_dir):
        parser.error("give one --out-dir per --hf-dir")

    init_model_parallel(tensor_parallel_size=int(os.environ["WORLD_SIZE"]))
    for hf_dir, out_dir in zip(args.hf_dir, args.out_dir):
        model = build_gpt_model(hf_dir, {}, load_weights=True)
        buckets = [
            [(name, tensor.numel() * tensor.element_size()) for name, tensor in bucket]
            for bucket in iter_hf_weight_buckets(model, args.bucket_bytes)
        ]
        # Small shards so the multi-file + index path is exercised too.
        save_hf_checkpoint(model, hf_dir, out_dir, shard_bytes=64 * 1024)
        if dist.get_rank() == 0:
            (Path(out_dir) / "buckets.json").write_text(json.dumps(buckets))
    destroy_model_parallel()


if __name__ == "__main__":
    main()
