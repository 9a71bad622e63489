"""Delta weight sync on a real model: bytes on the wire, and end-to-end sync time at a throttled link.

SmolLM2-135M-Instruct (examples/models/pretrained.py) is trained on CPU the way a real run keeps its
weights: fp32 master weights and AdamW (betas 0.9/0.98, weight decay 0.1, slime's GRPO settings)
at an RL learning rate (--lr, default 1e-6), and every version is exported in the engine's dtype
(--dtype, default bf16, the model's published dtype). The loss is the LM loss on a few chat
prompts: Adam's update of a weight is ~lr whatever the gradient's scale, so how many bits change
depends on lr and dtype far more than on which loss made the gradient.

Bytes on the wire (slime_async/weights/delta, XOR + byte shuffle + zstd level 3, every frame
header included) for: a full transfer; a delta after 1 step (v0 -> v1); a delta after 10 steps
(v0 -> v10: an engine that held v0 while ten steps trained, as with --update-weights-interval 10);
and the per-sync delta at step 10 (v9 -> v10, syncing every step).

End-to-end sync time: a real CPU engine (python -m actors.engine.cpu, --dtype as above) behind a
throttling TCP proxy on 127.0.0.1 (the trainer -> engine direction limited to --bandwidth Mbit/s;
the engine's answers are small). Each time is ``DeltaSender.push`` from the first byte to the
engine's answer: the state query, encoding (a fresh sender, nothing cached), the transfer,
reconstruction and checksums on the engine's side, the load into the model and the engine's
checksum of what it then serves.

    python benchmarks/delta_sync.py                       # writes benchmarks/results/delta_sync.{json,md}
    python benchmarks/delta_sync.py --steps 10 --lr 1e-6 1e-5 --bandwidth 100 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import torch  # noqa: E402

from actors.weight_sync.delta import DeltaSender, PushResult, Snapshot  # noqa: E402

PROMPTS = ["What is 17 times 23?", "Write a haiku about autumn.", "Name three prime numbers above 50.",
           "Explain what a hash function is in one sentence."]


def train_versions(model_dir: Path, lr: float, steps: int, dtype: torch.dtype) -> tuple[dict[int, dict], list[float]]:
    """The exported state dicts (HF names, ``dtype``) of versions 0, 1, steps-1 and steps, and the step losses."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                           add_generation_prompt=True) + "Sure." for p in PROMPTS]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.1)

    def export() -> dict:
        # What the trainer's HF export holds: tied weights once, in the checkpoint's dtype.
        return {name: tensor.detach().to(dtype).clone() for name, tensor in model.state_dict().items()
                if not (name == "lm_head.weight" and model.config.tie_word_embeddings)}

    # Only the versions the table compares are kept (each is the whole model).
    versions, losses = {0: export()}, []
    for step in range(1, steps + 1):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step in (1, steps - 1, steps):
            versions[step] = export()
    return versions, losses


def changed_fraction(a: dict, b: dict) -> float:
    changed = total = 0
    for name, tensor in a.items():
        bits_a, bits_b = (t.reshape(-1).view(torch.int16 if t.element_size() == 2 else torch.int32)
                          for t in (tensor, b[name]))
        changed += int((bits_a != bits_b).sum())
        total += tensor.numel()
    return changed / total


def encoded_bytes(target: Snapshot, base: Snapshot | None) -> int:
    """The request body ``push`` would stream (frames exactly as sent), without a network."""
    sender, counter = DeltaSender(), [0]

    async def drain() -> None:
        async for _ in sender._stream(target, base, counter):
            pass

    asyncio.run(drain())
    return counter[0]


class Throttle:
    """A TCP proxy on 127.0.0.1 that forwards to ``upstream``; client -> upstream at ``mbit`` Mbit/s."""

    def __init__(self, upstream_port: int, mbit: float) -> None:
        self.upstream_port, self.rate = upstream_port, mbit * 1e6 / 8  # bytes/s
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, self.rate), self._pipe(up_reader, writer, None),
                                 return_exceptions=True)
        except asyncio.CancelledError:  # the proxy stopped with a keep-alive connection open
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float | None) -> None:
        due = time.monotonic()
        while data := await reader.read(64 * 1024):
            if rate is not None:
                # Token bucket: a chunk may leave once the link has carried the ones before it.
                due = max(due, time.monotonic()) + len(data) / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def throttled(url: str, mbit: float | None) -> AsyncIterator[str]:
    if mbit is None:
        yield url
        return
    proxy = Throttle(int(url.rsplit(":", 1)[1]), mbit)
    port = await proxy.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await proxy.stop()


async def timed_syncs(engine_url: str, v0: Snapshot, v1: Snapshot, bandwidths: list[float]) -> list[dict]:
    rows = []
    for mbit in bandwidths:
        async with aiohttp.ClientSession() as session:
            await DeltaSender().push(session, engine_url, v0, None, timeout=3600)  # the engine holds v0
        # A session of its own, closed before the proxy stops (no keep-alive connection left in it).
        async with throttled(engine_url, mbit) as url, aiohttp.ClientSession() as session:
            delta = await DeltaSender().push(session, url, v1, v0, timeout=3600)
            full = await DeltaSender().push(session, url, v1, None, timeout=3600)
        for result in (delta, full):
            assert result.served_checksum == v1.checksum, result  # the engine serves v1, bit for bit
            rows.append(_row(mbit, result))
        print(f"  {mbit:g} Mbit/s: delta {delta.seconds:.2f} s ({delta.wire_bytes} B), "
              f"full {full.seconds:.2f} s ({full.wire_bytes} B)", flush=True)
    return rows


def _row(mbit: float, result: PushResult) -> dict:
    return {"mbit": mbit, "mode": result.mode, "wire_bytes": result.wire_bytes, "seconds": round(result.seconds, 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-6])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--bandwidth", type=float, nargs="+", default=[100, 1000], help="Mbit/s of the throttled link")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the training steps")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the per-sync delta compares the last two)")
    torch.set_num_threads(args.threads)
    from examples.models.pretrained import hf_checkpoint

    model_dir = hf_checkpoint(dtype="float32")
    dtype = getattr(torch, args.dtype)
    load_before = os.getloadavg()
    started = time.monotonic()
    results: dict = {"model": "SmolLM2-135M-Instruct", "dtype": args.dtype, "steps": args.steps,
                     "optimizer": "AdamW betas (0.9, 0.98) weight_decay 0.1, fp32 master weights",
                     "codec": "XOR vs the engine's version + byte shuffle + zstd level 3; xxh3-128 checksums",
                     "cpu_count": os.cpu_count(), "lrs": []}
    timing_versions = None
    for lr in args.lr:
        print(f"training {args.steps} steps at lr {lr:g} ...", flush=True)
        versions, losses = train_versions(model_dir, lr, args.steps, dtype)
        snaps = {i: Snapshot.of(str(i), v) for i, v in versions.items()}
        raw = sum(m.nbytes for m in snaps[0].metas.values())
        entry = {"lr": lr, "losses": [round(x, 4) for x in losses], "raw_bytes": raw,
                 "full_bytes": encoded_bytes(snaps[1], None),
                 "delta_1_step_bytes": encoded_bytes(snaps[1], snaps[0]),
                 "delta_10_steps_bytes": encoded_bytes(snaps[args.steps], snaps[0]),
                 "delta_per_sync_at_last_step_bytes": encoded_bytes(snaps[args.steps], snaps[args.steps - 1]),
                 "changed_fraction_1_step": round(changed_fraction(versions[0], versions[1]), 5),
                 "changed_fraction_10_steps": round(changed_fraction(versions[0], versions[args.steps]), 5)}
        results["lrs"].append(entry)
        print(json.dumps(entry), flush=True)
        if timing_versions is None:
            timing_versions = (snaps[0], snaps[1])
        del versions, snaps

    print("timing syncs into a CPU engine behind a throttled link ...", flush=True)
    results["sync_time"] = asyncio.run(_with_engine(model_dir, args.dtype, *timing_versions, args.bandwidth))
    results["loadavg_before"] = [round(x, 2) for x in load_before]
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    results["wall_s"] = round(time.monotonic() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "delta_sync.json").write_text(json.dumps(results, indent=2) + "\n")
    table = markdown(results)
    (args.out / "delta_sync.md").write_text(table)
    print(table)
    return 0


async def _with_engine(model_dir: Path, dtype: str, v0: Snapshot, v1: Snapshot, bandwidths: list[float]) -> list[dict]:
    from actors.engine.cpu.local import start_local_engine, stop_local_engine

    log_path = Path(tempfile.mkdtemp(prefix="delta-sync-engine-")) / "engine.log"
    process, url = await asyncio.to_thread(start_local_engine, model_dir, log_path, "--dtype", dtype,
                                           "--num-threads", "1", timeout=600)
    try:
        return await timed_syncs(url, v0, v1, bandwidths)
    finally:
        stop_local_engine(process)


def markdown(results: dict) -> str:
    mb, n = 1e6, results["steps"]
    lines = [f"Delta weight sync, {results['model']} exported as {results['dtype']} "
             f"({results['lrs'][0]['raw_bytes'] / mb:.1f} MB of weights), {results['optimizer']}.", "",
             f"| lr | full | delta after 1 step | delta after {n} steps (v0 -> v{n}) | per-sync delta at step {n} "
             f"(v{n - 1} -> v{n}) | weights changed (1 / {n} steps) |", "|---:|---:|---:|---:|---:|---:|"]
    for e in results["lrs"]:
        full = e["full_bytes"]
        cells = [f"{e[k] / mb:.2f} MB ({e[k] / full:.1%})" for k in
                 ("delta_1_step_bytes", "delta_10_steps_bytes", "delta_per_sync_at_last_step_bytes")]
        lines.append(f"| {e['lr']:g} | {full / mb:.1f} MB | {' | '.join(cells)} | "
                     f"{e['changed_fraction_1_step']:.1%} / {e['changed_fraction_10_steps']:.1%} |")
    lines += ["", f"End-to-end sync v0 -> v1 (lr {results['lrs'][0]['lr']:g}) into a CPU engine behind a throttled "
              "loopback link, encode to the engine's own checksum of what it serves:", "",
              "| link | delta | full | speed-up |", "|---:|---:|---:|---:|"]
    by_link: dict[float, dict] = {}
    for row in results["sync_time"]:
        by_link.setdefault(row["mbit"], {})[row["mode"]] = row
    for mbit, rows in by_link.items():
        d, f = rows["delta"], rows["full"]
        lines.append(f"| {mbit:g} Mbit/s | {d['seconds']:.2f} s ({d['wire_bytes'] / mb:.2f} MB) | "
                     f"{f['seconds']:.2f} s ({f['wire_bytes'] / mb:.1f} MB) | {f['seconds'] / d['seconds']:.1f}x |")
    lines += ["", f"Measured on {results['cpu_count']} shared CPU cores, load average "
              f"{results['loadavg_before'][0]:g} before / {results['loadavg_after'][0]:g} after "
              f"(other jobs ran beside it), {results['wall_s']:g} s in all.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
