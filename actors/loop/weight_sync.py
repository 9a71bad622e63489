"""One weight sync: quiesce the engines, move the trainer's weights to them, confirm, resume.

Order matters: the router stops dispatching first (aborting or draining what runs), so no
request reaches an engine between the pause and the confirmation that it serves the new
version; aborted requests come back to the rollout with their partial tokens and wait in the
router, to resume on the new weights.

An engine that (re)joins between syncs — an owned one restarted by its supervisor, an external
one restarted on its port — serves other weights than the current version, so the router keeps
it out as ``stale``. ``watch_engines`` brings each such engine to the current version alone
(the last disk export, or a broadcast to it only) and lets the router confirm it; without that a
run whose only engine restarted could never generate, hence never train, hence never sync.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from actors.loop.colocate import Colocation
from actors.loop.config import WeightTransport, WeightUpdateMode
from actors.loop.weight_group import EngineSetGroup, engine_identity, join_group, leave_group, send_weights
from actors.trainer.protocol import WeightGroupSpec
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient, EngineConnectionError
from slime_async.trace import TraceRecorder
from slime_async.weight_delta.sender import DeltaSender, PushResult, Snapshot

log = logging.getLogger(__name__)

# --weight-update-mode -> how the router quiesces its engines (RouterActor.pause).
# in_place: the engines pause their running requests with their KV and continue them on the
# new weights (SGLang pause_generation mode in_place): nothing aborted, nothing re-prefilled.
_ROUTER_PAUSE: dict[WeightUpdateMode, str] = {"abort": "abort", "pause": "drain", "in_place": "in_place"}


class WeightSyncError(RuntimeError):
    pass


@dataclass
class WeightSync:
    trainer: ActorRef
    router: ActorRef
    transport: WeightTransport
    mode: WeightUpdateMode
    weights_dir: Path
    api_key: str | None = None
    timeout: float | None = 300.0
    keep_exports: int = 2
    # delta transport: engine URL -> its receiver's URL (beside SGLang); an engine not named is
    # its own receiver (the CPU engine).
    delta_receivers: Mapping[str, str] = field(default_factory=dict)
    # A sync and a rejoining engine's update never overlap: the export directory (pruned by a
    # sync) and the trainer's weight group are the state they share.
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _version: int | None = field(default=None, init=False)  # the version the engines were last brought to
    _rejoins: int = field(default=0, init=False)  # engines brought to the current version after a (re)join
    _attempts: int = field(default=0, init=False)  # names each rejoin's one-off group uniquely
    # distributed transport: the group of the engine set, kept across syncs (weight_group.py).
    _group: EngineSetGroup | None = field(default=None, init=False, repr=False)
    # delta transport: the last version sent (what a delta is computed against) and the
    # transfers of the last sync.
    _delta: DeltaSender = field(default_factory=DeltaSender, init=False, repr=False)
    _delta_base: Snapshot | None = field(default=None, init=False, repr=False)
    _delta_results: list[PushResult] = field(default_factory=list, init=False, repr=False)
    # Multi-node runs: fails when an engine's node cannot read what the trainer exports (disk transport).
    export_dir_check: Callable[[], Awaitable[None]] | None = None
    # --colocate (tensor transport): the phases around the update on the shared devices.
    colocation: Colocation | None = None
    # --trace-dir: each sync is a span on the timeline, its pause, transfer and resume inside it.
    trace: TraceRecorder = field(default_factory=TraceRecorder.off, repr=False)

    async def check_engines(self) -> None:
        """Fail at start, not at the first sync, when the engines cannot take this transport."""
        if self.transport == "disk":
            if self.export_dir_check is not None:
                await self.export_dir_check()
            return
        if self.transport == "tensor":
            return  # its layout is read at each update (actors/loop/colocate.py)
        urls = [engine["url"] for engine in await self.router.ask("engines")]
        if self.transport == "delta":
            await self._check_receivers(urls)
            return
        async with aiohttp.ClientSession() as session:
            await self._layout([EngineClient(url, session=session, api_key=self.api_key) for url in urls])

    async def __call__(self, version: int) -> float:
        """Bring every engine to ``version``; returns the seconds it took."""
        async with self._lock:
            return await self._sync(version)

    async def _sync(self, version: int) -> float:
        started = time.monotonic()
        lane = self.trace.lane("weight sync", "sync")
        sync_span = self.trace.now()
        # A drain waits for the generations in flight, which the router's per-call timeout bounds.
        with self.trace.span("pause", lane, cat="weight_sync", mode=self.mode):
            await self.router.ask("pause", _ROUTER_PAUSE[self.mode], timeout=self.timeout if self.mode != "pause" else None)
        urls = [engine["url"] for engine in await self.router.ask("engines") if engine["health"] != "down"]
        with self.trace.span(f"transfer ({self.transport})", lane, cat="weight_sync", engines=len(urls)):
            async with aiohttp.ClientSession() as session:
                clients = [EngineClient(url, session=session, api_key=self.api_key) for url in urls]
                if self.transport == "disk":
                    await self._via_disk(clients, version)
                elif self.transport == "delta":
                    await self._via_delta(clients, version)
                elif self.transport == "tensor":
                    await self._colocated().update_weights(clients, version)
                else:
                    await self._via_broadcast(clients, version)
        with self.trace.span("resume", lane, cat="weight_sync"):
            states = await self.router.ask("resume", str(version), timeout=self.timeout)
        self.trace.record(f"weight sync v{version}", lane, sync_span, cat="weight_sync", version=version,
                          transport=self.transport, mode=self.mode)
        self._version = version
        behind = {url: state for url, state in states.items() if state != "up"}
        if behind:
            log.error("weight sync v%d: engines not serving the new version: %s", version, behind)
        return time.monotonic() - started

    async def watch_engines(self, interval: float = 1.0) -> None:
        """Forever: every ``interval`` s, bring engines the router holds out as stale to the current version."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh_stale()
            except Exception as error:  # noqa: BLE001 - the next round tries again; the run goes on
                log.warning("weight sync: updating a rejoined engine failed: %s", error)

    async def refresh_stale(self) -> list[str]:
        """Load the current weights into every engine the router keeps out as stale (healthy,
        other weights: restarted), one at a time, and have the router confirm each; returns
        the URLs it brought back. Nothing to do before the first sync: an owned engine that
        restarts then serves the HF checkpoint, which is version 0."""
        if self._version is None:
            return []
        async with self._lock:
            version = self._version
            stale = [e["url"] for e in await self.router.ask("engines") if e["health"] == "stale" and not e["paused"]]
            rejoined = []
            for url in stale:
                if await self._rejoin(url, version) == "up":
                    rejoined.append(url)
            return rejoined

    async def _rejoin(self, url: str, version: int) -> str:
        started = self.trace.now()
        await self.router.ask("pause", "abort", urls=[url], timeout=self.timeout)
        try:
            async with aiohttp.ClientSession() as session:
                client = EngineClient(url, session=session, api_key=self.api_key)
                if self.transport == "disk":
                    # The export of the current version is kept until the next sync prunes it.
                    result = await client.update_weights_from_disk(
                        str(self.weights_dir / f"v{version}"), weight_version=str(version), timeout=self.timeout)
                    self._check([client], [result])
                elif self.transport == "tensor":
                    await self._colocated().rejoin(client, version)
                elif self.transport == "delta":
                    # The version last sent; a restarted engine's receiver holds none: a full transfer.
                    await self._push_delta([client], self._delta_base)
                else:
                    # The trainer may have trained a step since the last sync: labelled with this
                    # version, those weights only look older than they are, and the next sync
                    # brings the engine in line with the others.
                    # A group of its own, once: the engine set's group is rebuilt at the next sync,
                    # as this engine restarted (it lost its place in that group).
                    self._attempts += 1
                    if self._group is not None:
                        self._group.forget()
                    await self._via_broadcast([client], version, group_name=f"weights-v{version}-rejoin{self._attempts}")
        finally:
            states = await self.router.ask("resume", str(version), urls=[url], timeout=self.timeout)
        state = states.get(url, "unknown")
        self.trace.record(f"rejoin v{version}", self.trace.lane("weight sync", "sync"), started, cat="weight_sync",
                          engine=url, version=version, transport=self.transport, state=state)
        if state == "up":
            self._rejoins += 1
            log.warning("engine %s rejoined with other weights: loaded the current weights (v%d) into it", url, version)
        else:
            log.error("engine %s rejoined with other weights; loading v%d into it left it %s", url, version, state)
        return state

    def _colocated(self) -> Colocation:
        if self.colocation is None:
            raise WeightSyncError("--update-weight-transport tensor needs --colocate")
        return self.colocation

    async def _via_disk(self, clients: list[EngineClient], version: int) -> None:
        path = self.weights_dir / f"v{version}"
        await self.trainer.ask("export_hf", str(path), timeout=self.timeout)
        results = await asyncio.gather(
            *(c.update_weights_from_disk(str(path), weight_version=str(version), timeout=self.timeout) for c in clients),
            return_exceptions=True)
        self._check(clients, results)
        self._prune(version)

    def metrics(self) -> dict[str, float]:
        """What the loop logs after each step: engines brought back after a (re)join, and with the
        delta transport the last transfer's bytes on the wire (all engines), their share of a full
        transfer's, and how many engines got a full one."""
        out = {"router/engine_rejoins": float(self._rejoins)}
        if self.colocation is not None:
            out |= self.colocation.metrics()
        if self.transport == "distributed":
            out["perf/weight_sync_group_inits"] = float(self._group.inits if self._group is not None else 0)
        if self.transport == "delta":  # no transfer at all when every engine was gone: 0 bytes, no ratio
            wire = sum(r.wire_bytes for r in self._delta_results)
            full = sum(r.full_bytes for r in self._delta_results)
            out |= {"perf/weight_sync_wire_bytes": float(wire),
                    "perf/weight_sync_full_transfers": float(sum(r.mode == "full" for r in self._delta_results))}
            if full:
                out["perf/weight_sync_wire_ratio"] = wire / full
        return out

    @property
    def delta_results(self) -> list[PushResult]:
        """delta transport: each engine's transfer in the last sync or rejoin (mode, bytes, seconds)."""
        return list(self._delta_results)

    async def _via_delta(self, clients: list[EngineClient], version: int) -> None:
        path = self.weights_dir / f"v{version}"
        await self.trainer.ask("export_hf", str(path), timeout=self.timeout)
        # The supervisor holds this version and the last one (2x the weights) while it sends.
        target = await asyncio.to_thread(Snapshot.from_hf_dir, str(version), path)
        await self._push_delta(clients, target)
        self._delta_base = target
        self._delta.forget(keep=target.version)
        self._prune(version)

    async def _push_delta(self, clients: list[EngineClient], target: Snapshot | None) -> None:
        if target is None:
            raise WeightSyncError("delta transport: no version has been exported yet")
        base = self._delta_base
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(
                *(self._delta.push(session, self._receiver(c.url), target, base, headers=headers, timeout=self.timeout)
                  for c in clients), return_exceptions=True)
        self._delta_results = [r for r in results if isinstance(r, PushResult)]
        for result in self._delta_results:
            log.info("weight sync v%s -> %s: %s transfer, %d bytes on the wire for %d bytes of weights, %.2f s%s%s",
                     target.version, result.url, result.mode, result.wire_bytes, result.full_bytes, result.seconds,
                     f" (the delta failed: {result.fallback})" if result.fallback else "",
                     f", served checksum {result.served_checksum}" if result.served_checksum else "")
        # The router's resume() keeps engines that failed out as stale; the watcher retries each.
        self._check(clients, results)

    def _receiver(self, engine_url: str) -> str:
        return self.delta_receivers.get(engine_url, engine_url).rstrip("/")

    async def _check_receivers(self, urls: Sequence[str]) -> None:
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(*(self._delta.receiver_state(session, self._receiver(url), timeout=30.0)
                                             for url in urls), return_exceptions=True)
        for url, result in zip(urls, results):
            if isinstance(result, BaseException):
                raise WeightSyncError(
                    f"--update-weight-transport delta: engine {url} has no weight-delta receiver ({result}); "
                    "the CPU engine is its own, an SGLang engine needs `python -m actors.engine.delta_receiver` "
                    "beside it, named in --update-weight-delta-receivers ENGINE_URL=RECEIVER_URL")

    async def _via_broadcast(self, clients: list[EngineClient], version: int, group_name: str | None = None) -> None:
        infos = await asyncio.gather(*(c.get_server_info(timeout=self.timeout) for c in clients), return_exceptions=True)
        for client, info in zip(clients, infos):
            if isinstance(info, BaseException) and not _lost_connection(info):
                raise info
        gone = [c.url for c, info in zip(clients, infos) if isinstance(info, BaseException)]
        if gone:
            # Killed between the router's last health check and this sync (an owned one may be
            # restarting): the broadcast goes to the others, and resume() keeps these out as stale
            # until the watcher updates each.
            log.error("weight sync v%d: engine(s) %s do not answer; each is updated when it answers again",
                      version, ", ".join(gone))
            clients = [c for c, info in zip(clients, infos) if not isinstance(info, BaseException)]
            infos = [info for info in infos if not isinstance(info, BaseException)]
            if not clients:
                return
        rank_offsets, world_size = broadcast_layout([c.url for c in clients], infos)
        try:
            if group_name is not None:  # a one-off group (a rejoining engine)
                # The group's master is trainer rank 0, on whichever node holds it (slime_async.cluster).
                master_address, master_port = await self.trainer.ask("weight_master", timeout=self.timeout)
                spec = WeightGroupSpec(master_address=master_address, master_port=master_port, world_size=world_size,
                                       group_name=group_name, backend=_backend(), timeout=self.timeout)
                await update_engine_weights(self.trainer, clients, spec, rank_offsets=rank_offsets,
                                            weight_version=str(version), timeout=self.timeout)
            else:
                if self._group is None:
                    self._group = EngineSetGroup(self.trainer, _backend(), timeout=self.timeout,
                                                 api_key=self.api_key)
                spec = await self._group.ensure(clients, [engine_identity(i) for i in infos], rank_offsets, world_size)
                await send_weights(self.trainer, clients, spec.group_name, str(version), timeout=self.timeout)
        except Exception as error:
            if group_name is None and self._group is not None:
                # Its peers are out of step (the trainer's side destroyed itself): the next sync
                # builds a new group, destroying what is left of this one on the engines first.
                self._group.forget()
            gone = [c.url for c, up in zip(clients, await asyncio.gather(*(_answers(c) for c in clients))) if not up]
            if not gone and not _lost_connection(error):
                raise
            gone = gone or [c.url for c in clients]
            # An engine died during the collective (killed, crashed): the others may hold a part of
            # the update, so resume() keeps every engine not on this version out as stale, and the
            # watcher loads the current weights into each once it answers again. The run goes on.
            log.error("weight sync v%d: engine(s) %s went away during the broadcast (%s); each is updated "
                      "when it answers again", version, ", ".join(gone), error)
            return
        await asyncio.gather(*(c.flush_cache() for c in clients), return_exceptions=True)

    async def close(self) -> None:
        """At shutdown: tear down the engine set's weight-update group (trainer and engines)."""
        if self._group is None or self._group.spec is None:
            return
        urls = [m.url for m in self._group.members]
        async with aiohttp.ClientSession() as session:
            await self._group.close([EngineClient(url, session=session, api_key=self.api_key) for url in urls])

    async def _layout(self, clients: list[EngineClient]) -> tuple[list[int], int]:
        infos = await asyncio.gather(*(c.get_server_info(timeout=self.timeout) for c in clients))
        return broadcast_layout([c.url for c in clients], infos)

    @staticmethod
    def _check(clients: list[EngineClient], results: list[object]) -> None:
        failures = []
        for client, result in zip(clients, results):
            if isinstance(result, BaseException):
                failures.append(f"{client.url}: {result}")
            elif isinstance(result, dict) and not result.get("success", True):
                failures.append(f"{client.url}: {result.get('message')}")
        if failures:
            # The router's resume() keeps such engines out as stale; the run goes on without them.
            log.error("weight update failed on %d engine(s): %s", len(failures), "; ".join(failures))

    def _prune(self, version: int) -> None:
        for old in self.weights_dir.glob("v*"):
            try:
                if int(old.name[1:]) <= version - self.keep_exports:
                    shutil.rmtree(old, ignore_errors=True)
            except ValueError:
                continue


async def update_engine_weights(
    trainer: ActorRef,
    engines: Sequence[Any],
    spec: WeightGroupSpec,
    weight_version: str | None = None,
    timeout: float | None = None,
    rank_offsets: Sequence[int] | None = None,
    flattened: bool = True,
) -> int:
    """Distributed weight update of ``engines`` (EngineClients) from trainer rank 0 over a one-off group.

    ``rank_offsets``: each engine's first rank in the group (default one rank each: 1, 2, ...).
    Joins the group, broadcasts (``weight_group.send_weights``), destroys the group. A sync keeps
    its group instead (``EngineSetGroup``). Returns the number of tensors sent.
    """
    offsets = list(rank_offsets) if rank_offsets is not None else [i + 1 for i in range(len(engines))]
    await join_group(trainer, engines, spec, offsets, timeout=timeout)
    try:
        return await send_weights(trainer, engines, spec.group_name, weight_version, timeout=timeout,
                                  flattened=flattened)
    finally:
        await leave_group(trainer, engines, spec.group_name, timeout=timeout)


async def _answers(client: EngineClient) -> bool:
    """Whether the engine answers its health check now (a dead one refuses the connection)."""
    try:
        return await client.health(timeout=5.0)
    except Exception:  # noqa: BLE001 - any failure to answer is "not answering"
        return False


def _lost_connection(error: BaseException) -> bool:
    """Whether an engine's connection broke (it died; an owned one may already be restarting)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, EngineConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def broadcast_layout(urls: Sequence[str], server_infos: Sequence[Mapping[str, Any]]) -> tuple[list[int], int]:
    """Each engine's rank offset in the weight-update group, and the group's world size.

    Trainer rank 0 is group rank 0. SGLang puts TP worker k of an engine at ``rank_offset + k``
    and ignores its DP and PP ranks, so an engine takes ``tp_size`` ranks and one with
    ``dp_size`` or ``pp_size`` > 1 would put two workers on one rank: refused, naming it.
    """
    offsets, next_rank = [], 1
    for url, info in zip(urls, server_infos, strict=True):
        for field_name in ("dp_size", "pp_size"):
            if int(info.get(field_name) or 1) > 1:
                raise WeightSyncError(
                    f"engine {url} runs with {field_name}={info[field_name]}: SGLang's distributed weight update "
                    "gives its workers clashing ranks; use --update-weight-transport disk")
        offsets.append(next_rank)
        next_rank += int(info.get("tp_size") or 1)
    return offsets, next_rank


def _backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
