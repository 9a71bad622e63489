"""The tensor transport: the trainer's weights reach engines on its own devices as IPC handles.

Bucket by bucket, the trainer gathers full HF-named tensors and hands each serving rank's bucket
over as one payload of handles (slime_async/weights/tensor_ipc.py: CUDA IPC on GPU, shared-memory
files on CPU); every engine TP worker opens the handles of the trainer rank on its device and
copies the tensors (``/update_weights_from_tensor``). Nothing goes through the disk or a
collective, so it needs the engine on the trainer's device: colocated (--colocate, where the
phases around it are colocate.py's), or both resident on one GPU (one-step-off or fully-async on
one device), which ``check`` establishes at start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import psutil

from actors.weight_sync.errors import WeightSyncError
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient
from slime_async.task_group import gather_settled

log = logging.getLogger(__name__)

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class TensorTransport:
    def __init__(self, trainer: ActorRef, timeout: float | None = 300.0,
                 engine_pids: Callable[[str], set[int]] | None = None) -> None:
        self.trainer = trainer
        self.timeout = timeout
        self._engine_pids = engine_pids or local_engine_pids
        self.buckets = 0  # sent by the last update

    async def check(self, clients: Sequence[EngineClient]) -> None:
        """Refuse, in one line, an engine that is not on a device of the trainer's: its workers could
        not open the handles (another host) or would copy across devices (another GPU)."""
        for client in clients:
            host = urlsplit(client.url).hostname or ""
            if host not in _LOOPBACK and host != os.environ.get("SLIME_NODE_IP"):
                raise WeightSyncError(
                    f"--update-weight-transport tensor: engine {client.url} is not on this host, so it cannot "
                    "open the trainer's IPC handles; use --update-weight-transport distributed or disk")
        sharing = await self.trainer.ask("device_pids", timeout=self.timeout)
        if sharing is None:
            return  # CPU: the host is the device, and every local engine reads its shared memory
        for client in clients:
            pids = self._engine_pids(client.url)
            if pids and not pids & set(sharing):
                raise WeightSyncError(
                    f"--update-weight-transport tensor: engine {client.url} runs on another GPU than the trainer "
                    "(none of its processes is on the trainer rank's device); put them on one GPU, or use "
                    "--update-weight-transport distributed")

    async def send(self, clients: Sequence[EngineClient], version: int, *, flush_cache: bool) -> list[object]:
        """Every bucket into every engine; ``flush_cache`` with the last one (the engines are idle).
        Each engine's outcome: None, or the exception that left it out (unreachable, an error answer):
        the others get every bucket, and the caller reports the engine as it does a failed disk load."""
        try:
            results, self.buckets = await self._send_buckets(clients, str(version), flush_cache)
        finally:
            await self.trainer.ask("end_tensor_export", timeout=self.timeout)
        return results

    async def rejoin(self, client: EngineClient, version: int) -> list[object]:
        return await self.send([client], version, flush_cache=False)

    async def _send_buckets(self, clients: Sequence[EngineClient], version: str,
                            flush_cache: bool) -> tuple[list[object], int]:
        # Engine i's TP worker k opens the handles of the trainer rank on its device: ranks
        # offset_i + k in placement order (the run checked at start that the counts match; a CPU
        # engine reads any rank's shared memory, so fewer ranks than workers wrap around).
        ranks = len(await self.trainer.ask("rank_info"))
        infos = await gather_settled(*(c.get_server_info(timeout=self.timeout) for c in clients))
        layout, next_rank = [], 0
        for info in infos:
            # One that did not answer gets no bucket; 1 keeps the next engines' ranks where they were.
            tp = int(info.get("tp_size") or 1) if isinstance(info, dict) else 1
            layout.append([(next_rank + k) % ranks for k in range(tp)])
            next_rank += tp
        results: list[object] = [info if isinstance(info, BaseException) else None for info in infos]
        serving = sorted({rank for workers in layout for rank in workers})
        sent = 0
        # One bucket at a time: the trainer frees a bucket's tensors when asked for the next, after
        # every engine copied it, so at most one bucket sits beside the weights on the device.
        payloads = await self.trainer.ask("next_tensor_bucket", serving, timeout=self.timeout)
        while payloads is not None:
            live = [i for i, result in enumerate(results) if result is None]
            answers = await gather_settled(*(
                clients[i].update_weights_from_tensor([payloads[r] for r in layout[i]], weight_version=version,
                                                      flush_cache=False, timeout=self.timeout) for i in live))
            for i, answer in zip(live, answers):
                if isinstance(answer, BaseException):  # out of the later buckets: it holds mixed weights now
                    results[i] = answer
            sent += 1
            payloads = await self.trainer.ask("next_tensor_bucket", serving, timeout=self.timeout)
        await self._refuse_mixed_weights(clients, results, version)
        if flush_cache:
            await gather_settled(*(c.flush_cache(timeout=self.timeout) for c, r in zip(clients, results) if r is None))
        return results, sent

    async def _refuse_mixed_weights(self, clients: Sequence[EngineClient], results: Sequence[object],
                                    version: str) -> None:
        """Each bucket carries the version, so an engine that took some buckets and then failed
        (an error answer, a dropped connection) may hold a mix under the new version's name, which
        the router would take for the new weights. One that answers so stops the sync; one that is
        gone (killed: it restarts with its checkpoint's weights and version) is reported and
        rejoins with a full set."""
        failed = [(c, r) for c, r in zip(clients, results) if r is not None]
        versions = await gather_settled(*(c.get_weight_version(timeout=self.timeout) for c, _ in failed))
        mixed = [f"{c.url} ({r})" for (c, r), v in zip(failed, versions) if v == version]
        if mixed:
            raise WeightSyncError(f"update_weights_from_tensor v{version} failed part-way on engine(s) that now "
                                  f"report v{version} with a mix of old and new weights: {'; '.join(mixed)}")

    def metrics(self) -> dict[str, float]:
        return {"perf/weight_sync_buckets": float(self.buckets)}

    async def close(self) -> None:
        pass


def local_engine_pids(url: str) -> set[int]:
    """The processes of the local engine behind ``url``: the one listening on its port and its
    descendants (SGLang's scheduler and TP workers are children of its HTTP server)."""
    port = urlsplit(url).port
    try:
        listening = {c.pid for c in psutil.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    except psutil.Error:
        return set()
    pids = set(listening)
    for pid in listening:
        try:
            pids |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
    return pids
