"""The disk transport: the trainer writes an HF checkpoint dir, every engine loads it.

``update_weights_from_disk`` flushes the engine's prefix cache unless told ``flush_cache: false``,
and SGLang asserts (the server exits) when it flushes with requests in its running batch: the
caller says whether the engines are idle (``flush_cache``).
"""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient
from slime_async.task_group import gather_settled


@dataclass
class DiskTransport:
    trainer: ActorRef
    weights_dir: Path
    timeout: float | None = 300.0
    keep_exports: int = 2  # the current export stays for a rejoining engine until the next sync prunes it
    # Multi-node runs: fails when an engine's node cannot read what the trainer exports.
    export_dir_check: Callable[[], Awaitable[None]] | None = None

    async def check(self, urls: Sequence[str]) -> None:
        if self.export_dir_check is not None:
            await self.export_dir_check()

    async def send(self, clients: Sequence[EngineClient], version: int, *, flush_cache: bool) -> list[object]:
        """Export ``version`` and load it into every engine; each engine's answer or exception."""
        path = await self.export(version)
        results = await gather_settled(*(
            c.update_weights_from_disk(str(path), weight_version=str(version), flush_cache=flush_cache,
                                       timeout=self.timeout) for c in clients))
        self.prune(version)
        return results

    async def rejoin(self, client: EngineClient, version: int) -> list[object]:
        # The export of the current version is kept until the next sync prunes it.
        return await gather_settled(client.update_weights_from_disk(
            str(self.weights_dir / f"v{version}"), weight_version=str(version), flush_cache=False, timeout=self.timeout))

    async def export(self, version: int) -> Path:
        path = self.weights_dir / f"v{version}"
        await self.trainer.ask("export_hf", str(path), timeout=self.timeout)
        return path

    def prune(self, version: int) -> None:
        for old in self.weights_dir.glob("v*"):
            try:
                if int(old.name[1:]) <= version - self.keep_exports:
                    shutil.rmtree(old, ignore_errors=True)
            except ValueError:
                continue

    def metrics(self) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        pass
