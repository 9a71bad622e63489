"""The CPU engine's memory across a colocated step, for a real model (SmolLM2-135M-Instruct).

    .venv/bin/python -m benchmarks.colocate_memory [--dtype float32]

Starts a CPU engine, then: release weights + KV cache, resume weights, load the checkpoint's
tensors back through /update_weights_from_tensor (shared-memory handles from this process, in
buckets), resume the KV cache, generate. Prints the engine's resident memory (its own VmRSS, from
/get_server_info) after each phase, and whether the reloaded engine answers as before.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from actors.engine.cpu.local import start_local_engine, stop_local_engine
from slime_async.engine_client import EngineClient
from examples.models.pretrained import hf_checkpoint
from slime_async.weights.tensor_ipc import serialize_named_tensors

BUCKET_BYTES = 64 << 20


async def measure(url: str, model: Path) -> dict:
    out: dict = {}
    async with EngineClient(url) as client:
        async def rss(label: str) -> None:
            memory = (await client.get_server_info())["memory_occupation"]
            out[label] = {"rss_mb": round(memory["rss_bytes"] / 2**20, 1),
                          "weights_mb": round(memory["weight_bytes"] / 2**20, 1)}

        prompt = [1, 2, 3, 4, 5, 6, 7, 8]
        params = {"temperature": 0.0, "max_new_tokens": 8}
        before = await client.generate(prompt, params, return_logprob=True)
        await rss("serving")
        await client.release_memory_occupation(["weights", "kv_cache"])
        await rss("released")
        await client.resume_memory_occupation(["weights"])
        await rss("weights resumed (zeros)")
        tensors = {}
        for file in sorted(model.glob("*.safetensors")):
            tensors |= load_file(str(file))
        bucket, size, buckets = [], 0, 0
        for name, tensor in sorted(tensors.items()):
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= BUCKET_BYTES:
                await client.update_weights_from_tensor([serialize_named_tensors(bucket)], weight_version="1")
                bucket, size, buckets = [], 0, buckets + 1
        if bucket:
            await client.update_weights_from_tensor([serialize_named_tensors(bucket)], weight_version="1")
            buckets += 1
        await client.resume_memory_occupation(["kv_cache"])
        after = await client.generate(prompt, params, return_logprob=True)
        await rss("reloaded")
        out["buckets"] = buckets
        out["same_tokens_after_reload"] = before["output_ids"] == after["output_ids"]
        pairs = zip(before["meta_info"]["output_token_logprobs"], after["meta_info"]["output_token_logprobs"])
        out["max_logprob_diff"] = max(abs(a[0] - b[0]) for a, b in pairs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    model = hf_checkpoint(dtype=args.dtype)
    log = Path(tempfile.mkdtemp(prefix="colocate-memory-")) / "engine.log"
    process, url = start_local_engine(model, log, "--dtype", args.dtype, timeout=600)
    try:
        print(json.dumps(asyncio.run(measure(url, model)), indent=1))
    finally:
        stop_local_engine(process)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
