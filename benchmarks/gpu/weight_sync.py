"""Distributed weight sync, pause to resume: one broadcast per tensor vs flattened buckets, over the
kept weight-update group, against the raw broadcast bandwidth between the same two GPUs.

    # the GPU host (benchmarks/gpu/h200.sh weight-sync): SGLang serves the shape's model on GPU 0,
    # this script and its trainer rank use GPU 1
    CUDA_VISIBLE_DEVICES=1 python benchmarks/gpu/weight_sync.py --shape qwen2.5-1.5b --model-dir /tmp/m15 \\
        --url http://127.0.0.1:30000 --peer-gpu 0
    python benchmarks/gpu/weight_sync.py --shape tiny   # CPU check: a CPU engine, gloo

What one sync does here is what WeightSync does for the distributed transport, minus the router:
``pause_generation`` on the engine, ``send_weights`` over the engine set's group (EngineSetGroup,
built once before the timed syncs: its build time is printed apart), ``continue_generation``.
The trainer is a real torchrun rank (TrainerActor; Megatron, bf16 on CUDA). Each mode's first
sync is a warm-up; the table gives medians of ``--repeats``. "broadcast GB/s" is the weights'
bytes over the ``send_weights`` time (gathers, flattening, broadcast and the engine's load, all
of it); "raw" is a broadcast of the same bytes in buckets of the same size between two bare
processes on the same two devices (this one and a child on ``--peer-gpu``), measured in the same run.
Goals (issue #17): the 1.5B shape's sync <= 0.15 s pause to resume; broadcast >= 50% of raw.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from benchmarks.gpu.qwen_shapes import write_random_model  # noqa: E402
from slime_async.dtypes import dtype_from_name  # noqa: E402
from slime_async.weights.flat_bucket import nbytes  # noqa: E402

CUDA = torch.cuda.is_available()
BACKEND = "nccl" if CUDA else "gloo"

# The raw-bandwidth peer: joins the group as rank 1 and receives what rank 0 broadcasts.
_PEER = """
import sys, torch, torch.distributed as dist
from slime_async.weights.process_group import init_custom_process_group
port, sizes, rounds = int(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
device = "cuda" if torch.cuda.is_available() else "cpu"
group = init_custom_process_group("nccl" if device == "cuda" else "gloo", f"tcp://127.0.0.1:{port}", 2, 1, "raw")
buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in sizes]
for _ in range(rounds):
    for buf in buffers:
        dist.broadcast(buf, src=0, group=group)
    if device == "cuda":
        torch.cuda.synchronize()
"""


def raw_broadcast_gbps(sizes: list[int], peer_gpu: str | None, repeats: int) -> float:
    """GB/s of broadcasting buffers of ``sizes`` bytes to a bare peer process (median of rounds)."""
    from slime_async.weights.process_group import init_custom_process_group, listening_store

    store = listening_store("127.0.0.1", timeout=timedelta(minutes=2))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if peer_gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = peer_gpu
    rounds = repeats + 1
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(store.port), ",".join(map(str, sizes)), str(rounds)],
                            env=env, cwd=REPO)
    try:
        group = init_custom_process_group(BACKEND, f"tcp://127.0.0.1:{store.port}", 2, 0, "raw",
                                          timeout=timedelta(minutes=2), store=store)
        device = "cuda" if CUDA else "cpu"
        buffers = [torch.ones(n, dtype=torch.uint8, device=device) for n in sizes]
        times = []
        for _ in range(rounds):
            if CUDA:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for buf in buffers:
                torch.distributed.broadcast(buf, src=0, group=group)
            if CUDA:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        torch.distributed.destroy_process_group(group)
    finally:
        peer.wait(timeout=120)
    return sum(sizes) / statistics.median(times[1:]) / 1e9


async def measure(args: argparse.Namespace, model_dir: Path, work: Path) -> None:
    import aiohttp

    from actors.weight_sync.distributed import EngineSetGroup, engine_identity, send_weights
    from actors.trainer.actor import TrainerActor
    from actors.megatron.config import TrainerConfig
    from slime_async.actor import spawn
    from slime_async.engine_client import EngineClient
    from slime_async.net import free_port
    from slime_async.process import ProcessChild, ProcessSpec, http_ready

    engine_ref, url = None, args.url
    if url is None:  # the CPU check: an embedded CPU engine on the same weights
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        engine_ref = await spawn(ProcessChild(ProcessSpec(
            name="cpu-engine", argv=[sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir),
                                     "--port", str(port)],
            env={"PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}, cwd=str(REPO),
            ready=http_ready(f"{url}/health"), ready_timeout=300.0), work / "logs"))
    megatron = {"bf16": True} if CUDA else {}
    config = TrainerConfig(hf_checkpoint=str(model_dir), actor_num_procs=1, megatron=megatron,
                           weight_bucket_mb=args.bucket_mb, trainer_start_timeout=600.0)
    trainer = await spawn(TrainerActor(config, work / "logs"))
    try:
        buckets = await trainer.ask("weight_metadata", timeout=None)
        sizes = [nbytes([dtype_from_name(m.dtype) for m in bucket], [m.shape for m in bucket]) for bucket in buckets]
        total = sum(sizes)
        print(f"{args.shape}: {sum(len(b) for b in buckets)} tensors, {total / 1e9:.3f} GB in {len(buckets)} "
              f"bucket(s) of <= {args.bucket_mb:g} MiB, backend {BACKEND}")
        rows = []
        async with aiohttp.ClientSession() as session:
            engine = EngineClient(url, session=session)
            info = await engine.get_server_info()
            group = EngineSetGroup(trainer, BACKEND, timeout=None)
            start = time.perf_counter()
            spec = await group.ensure([engine], [engine_identity(info)], [1], 1 + int(info.get("tp_size") or 1))
            print(f"group build (once per engine set; before #17, once per sync): {time.perf_counter() - start:.3f} s")
            version = 0
            for flattened in (False, True):
                syncs, broadcasts = [], []
                for _ in range(args.repeats + 1):
                    version += 1
                    start = time.perf_counter()
                    await engine.pause_generation(mode="abort")
                    sent = time.perf_counter()
                    await send_weights(trainer, [engine], spec.group_name, str(version), timeout=None,
                                       flattened=flattened)
                    broadcasts.append(time.perf_counter() - sent)
                    await engine.continue_generation()
                    syncs.append(time.perf_counter() - start)
                sync_s, broadcast_s = statistics.median(syncs[1:]), statistics.median(broadcasts[1:])
                rows.append(("flattened buckets" if flattened else "per tensor", sync_s, broadcast_s))
            await group.close([engine])
    finally:
        await trainer.stop()
        if engine_ref is not None:
            await engine_ref.stop()
    raw = raw_broadcast_gbps(sizes, args.peer_gpu, args.repeats)
    print(f"raw {BACKEND} broadcast, same buckets, same two devices: {raw:.2f} GB/s")
    print("| shape | mode | pause->resume s | send_weights s | broadcast GB/s | % of raw |")
    print("|---|---|---:|---:|---:|---:|")
    for mode, sync_s, broadcast_s in rows:
        gbps = total / broadcast_s / 1e9
        print(f"| {args.shape} | {mode} | {sync_s:.3f} | {broadcast_s:.3f} | {gbps:.2f} | {100 * gbps / raw:.0f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="tiny", help="qwen2.5-0.5b, qwen2.5-1.5b or tiny")
    parser.add_argument("--model-dir", type=Path, help="the shape's random model (written here if missing); "
                        "with --url, the directory the engine serves")
    parser.add_argument("--url", help="an engine serving --model-dir (SGLang); default: start a CPU engine")
    parser.add_argument("--peer-gpu", help="CUDA_VISIBLE_DEVICES of the raw-bandwidth peer (the engine's GPU)")
    parser.add_argument("--bucket-mb", type=float, default=512.0, help="--weight-bucket-mb of the trainer")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="weight-sync-bench-") as tmp:
        work = Path(tmp)
        model_dir = args.model_dir or work / "model"
        if not (model_dir / "config.json").exists():
            write_random_model(model_dir, args.shape, dtype=torch.bfloat16 if CUDA else torch.float32)
        asyncio.run(measure(args, model_dir, work))


if __name__ == "__main__":
    main()
