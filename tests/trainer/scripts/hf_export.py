"""torchrun script: load an HF checkpoint at TP=world size, export it back as HF.

Rank 0 writes the exported checkpoint to --out-dir and a report of the weight buckets
(names and byte sizes per bucket for --bucket-bytes) to --out-dir/buckets.json.
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
    parser.add_argument("--hf-dir", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--bucket-bytes", type=int, required=True)
    args = parser.parse_args()

    init_model_parallel(tensor_parallel_size=int(os.environ["WORLD_SIZE"]))
    model = build_gpt_model(args.hf_dir, {}, load_weights=True)
    buckets = [
        [(name, tensor.numel() * tensor.element_size()) for name, tensor in bucket]
        for bucket in iter_hf_weight_buckets(model, args.bucket_bytes)
    ]
    # Small shards so the multi-file + index path is exercised too.
    save_hf_checkpoint(model, args.hf_dir, args.out_dir, shard_bytes=64 * 1024)
    if dist.get_rank() == 0:
        (Path(args.out_dir) / "buckets.json").write_text(json.dumps(buckets))
    destroy_model_parallel()


if __name__ == "__main__":
    main()
