"""What a streamed /generate costs over the plain call (the router streams to learn each token's version).

Starts the embedded CPU engine on a tiny model and sends N concurrent requests of T tokens,
alternately plain and streamed (``EngineClient.generate(stream=True)``: one cumulative SSE chunk
per token, assembled by the client), for several rounds. Prints the wall time of each round and
the client process's CPU time per mode (the router's share of the cost), and the median ratio.

    .venv/bin/python benchmarks/stream_overhead.py                     # 64 x 64 tokens, 5 rounds
    .venv/bin/python benchmarks/stream_overhead.py --requests 16 --tokens 512 --rounds 3
    .venv/bin/python benchmarks/stream_overhead.py --incremental   # --incremental-streaming-output
    .venv/bin/python benchmarks/stream_overhead.py --url http://gpu-host:30000   # an SGLang server
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from actors.engine.cpu.local import start_local_engine, stop_local_engine  # noqa: E402
from slime_async.engine_client import EngineClient  # noqa: E402
from slime_async.generate_output import parse_generate_output  # noqa: E402


async def one_round(client: EngineClient, requests: int, tokens: int, stream: bool) -> tuple[float, float, int]:
    """(wall seconds, client CPU seconds, tokens generated) of ``requests`` concurrent requests."""
    params = {"temperature": 1.0, "max_new_tokens": tokens, "ignore_eos": True}
    wall, cpu = time.perf_counter(), time.process_time()
    answers = await asyncio.gather(*(client.generate([16 + i % 100, 17, 18], params, stream=stream)
                                     for i in range(requests)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, sum(len(parse_generate_output(a).output_ids) for a in answers)


async def measure(url: str, args: argparse.Namespace) -> None:
    async with EngineClient(url, timeout=600) as client:
        await one_round(client, 4, 4, True)  # warm-up: connections, the model's first forward
        rows: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
        for index in range(args.rounds):
            for stream in (False, True) if index % 2 == 0 else (True, False):  # alternate the order
                rows[stream].append(await one_round(client, args.requests, args.tokens, stream))
    mode = "incremental" if getattr(args, "incremental", False) else "cumulative"
    print(f"{args.requests} concurrent requests x {args.tokens} tokens, {args.rounds} rounds each ({mode} chunks)")
    for stream, label in ((False, "plain"), (True, "streamed")):
        walls = [w for w, _, _ in rows[stream]]
        cpus = [c for _, c, _ in rows[stream]]
        tokens = rows[stream][0][2]
        print(f"  {label:9s} wall s {' '.join(f'{w:.2f}' for w in walls)}  median {statistics.median(walls):.2f}"
              f"  ({tokens / statistics.median(walls):.0f} tok/s)  client CPU s median {statistics.median(cpus):.2f}")
    wall_ratio = statistics.median(w for w, _, _ in rows[True]) / statistics.median(w for w, _, _ in rows[False])
    cpu_ratio = statistics.median(c for _, c, _ in rows[True]) / statistics.median(c for _, c, _ in rows[False])
    print(f"  streamed / plain: wall x{wall_ratio:.2f}, client CPU x{cpu_ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="the CPU engine's torch threads")
    parser.add_argument("--incremental", action="store_true",
                        help="start the CPU engine with --incremental-streaming-output (chunks of new tokens only)")
    parser.add_argument("--url", help="measure this engine (SGLang) instead of a CPU engine started here")
    args = parser.parse_args()
    if args.url:
        asyncio.run(measure(args.url, args))
        return
    from examples.models.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="stream-overhead-"))
    model = build_tiny_model(work / "model", arch="qwen2", seed=0)
    process, url = start_local_engine(model, work / "engine.log", "--max-running-requests", str(args.requests),
                                      "--num-threads", str(args.threads),
                                      *(["--incremental-streaming-output"] if args.incremental else []))
    try:
        asyncio.run(measure(url, args))
    finally:
        stop_local_engine(process)


if __name__ == "__main__":
    main()
