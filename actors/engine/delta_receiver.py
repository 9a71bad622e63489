"""The delta weight-sync receiver beside an SGLang engine (on the engine's host).

    python -m actors.engine.delta_receiver --engine-url http://127.0.0.1:30000 \\
        --model-path /models/Qwen3-4B --dir /local/nvme/weights [--host 0.0.0.0] [--port 30100]

serves slime_async/weights/delta/wire.py's endpoints: it keeps the tensors of the version it
last loaded, rebuilds the next one from a delta and checks it, writes it as an HF checkpoint
under ``--dir`` (safetensors + the non-weight files of ``--model-path``: config, tokenizer) on
the engine's own disk, and has the engine load it with SGLang's ``/update_weights_from_disk``.
Name it to the run with ``--update-weight-delta-receivers ENGINE_URL=http://HOST:PORT``.

Its base lives in this process: a restarted receiver holds none and gets a full transfer; a
restarted engine does not matter to it (every load is a whole checkpoint from the local disk).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import torch
from aiohttp import web

from slime_async.engine_client import EngineClient, EngineError
from slime_async.net import serve_until_signalled
from slime_async.weights.delta.receiver import DeltaReceiver, LoadRejected, routes

log = logging.getLogger("delta_receiver")

WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class DiskLoader:
    """Writes each version under ``root`` and has the engine at ``engine_url`` load it."""

    engine_url: str
    model_path: Path
    root: Path
    api_key: str | None = None
    keep: int = 2
    timeout: float = 600.0

    async def __call__(self, tensors: dict[str, torch.Tensor], version: str, flush_cache: bool) -> str | None:
        path = self.root / f"v{version}"
        await asyncio.to_thread(self._write, path, tensors)
        async with aiohttp.ClientSession() as session:
            client = EngineClient(self.engine_url, session=session, api_key=self.api_key)
            try:
                answer = await client.update_weights_from_disk(str(path), weight_version=version,
                                                               flush_cache=flush_cache, timeout=self.timeout)
            except EngineError as exc:
                raise LoadRejected(f"engine {self.engine_url}: {exc}") from exc
        if isinstance(answer, dict) and not answer.get("success", True):
            raise LoadRejected(f"engine {self.engine_url}: {answer.get('message')}")
        self._prune(keep=path)
        return None  # SGLang does not say what it serves; its load from disk is whole

    def _write(self, path: Path, tensors: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        staging = path.with_name(path.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for item in self.model_path.iterdir():
            if item.is_file() and not any(item.match(pattern) for pattern in WEIGHT_FILES):
                shutil.copy2(item, staging / item.name)
        save_file(dict(tensors), str(staging / "model.safetensors"), metadata={"format": "pt"})
        shutil.rmtree(path, ignore_errors=True)
        staging.rename(path)  # the engine never sees a half-written checkpoint

    def _prune(self, keep: Path) -> None:
        versions = sorted((p for p in self.root.glob("v*") if p.is_dir() and p != keep),
                          key=lambda p: p.stat().st_mtime)
        for old in versions[: max(0, len(versions) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m actors.engine.delta_receiver", description=__doc__.split("\n")[0])
    parser.add_argument("--engine-url", required=True, help="the SGLang engine this receiver loads into")
    parser.add_argument("--model-path", required=True, type=Path,
                        help="the HF checkpoint the engine was started from (its config and tokenizer are copied)")
    parser.add_argument("--dir", required=True, type=Path, help="where the versions are written (the engine's disk)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default=None, help="the engine's API key, if it has one")
    parser.add_argument("--keep", type=int, default=2, help="versions kept on disk")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    loader = DiskLoader(args.engine_url.rstrip("/"), args.model_path, args.dir, args.api_key, args.keep)
    app = web.Application()
    app.add_routes(routes(DeltaReceiver(), loader))
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    # Read by whoever started it to learn the URL, as the CPU engine's line.
    print(f"delta receiver listening on http://{args.host}:{runner.addresses[0][1]}", flush=True)
    await serve_until_signalled(runner)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model_path / "config.json").is_file():
        print(f"error: --model-path {args.model_path} has no config.json", file=sys.stderr)
        return 2
    if args.keep < 1:
        print(f"error: --keep must be >= 1, got {args.keep}", file=sys.stderr)
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
