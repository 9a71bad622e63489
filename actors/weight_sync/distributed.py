"""The weight-update group between trainer rank 0 and the engines, and the calls that use it.

A group costs a rendezvous (over a second on GPU for NCCL), so one is kept per *engine set*:
built at the first distributed sync, reused by every sync after it, rebuilt only when the set
changes. The set is each engine's URL, its ranks, and its identity: the process behind the URL.
A restarted engine (owned, restarted by its supervisor; external, restarted on its port) has
lost its group although its URL is the same, so the identity comes from ``/server_info``: the
CPU engine's ``instance_id``, SGLang's ``startup_time`` (the timings of its own start, which a
restart does not repeat to the digit). An engine that reports neither is only known to have
restarted when the rejoin path brings it back or a broadcast to it fails (``forget``).

All groups meet on the store trainer rank 0 hosts (``weight_master``: bound, then reported), each
under its own name, so a rebuild needs no new port.

A failed sync must not leave the next one waiting: the calls of one join or broadcast are
awaited together and the first failure cancels the rest (``gather_or_cancel``); the trainer's
side of a group gives up on a collective after the weight-update timeout (``WeightGroupSpec.timeout``)
and destroys the group itself; each rebuild uses a new group name, so no engine or trainer call
can meet the stuck group's collective; and a rebuild destroys the old group on every old member,
also on one that left the set but is alive.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slime_async.weights.protocol import TensorMeta, WeightGroupSpec
from actors.weight_sync.errors import WeightSyncError
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient, EngineConnectionError
from slime_async.task_group import gather_or_cancel, gather_settled

log = logging.getLogger(__name__)

FLATTENED = "flattened_bucket"  # SGLang's load_format for one broadcast per bucket
_DESTROY_TIMEOUT = 10.0  # tearing down is best effort: a dead engine must not hold up the sync


@dataclass(frozen=True)
class Member:
    url: str
    rank_offset: int
    identity: str | None


def engine_identity(server_info: Mapping[str, Any]) -> str | None:
    """What tells this engine process from a restart on the same URL (None: it says nothing)."""
    if server_info.get("instance_id"):
        return str(server_info["instance_id"])
    if server_info.get("startup_time"):
        return json.dumps(server_info["startup_time"], sort_keys=True, default=str)
    return None


class EngineSetGroup:
    """The persistent group of one engine set: ``ensure`` it before each broadcast, ``forget``
    it when it cannot be trusted (a failed broadcast, a rejoined engine), ``close`` at the end."""

    def __init__(self, trainer: ActorRef, backend: str, timeout: float | None = 300.0, api_key: str | None = None):
        self.trainer = trainer
        self.api_key = api_key  # for the clients of old members that left the set
        self.backend = backend
        self.timeout = timeout
        self.spec: WeightGroupSpec | None = None
        self.members: tuple[Member, ...] = ()
        self.inits = 0  # groups built so far (perf/weight_sync_group_inits)
        self._valid = False

    async def ensure(self, engines: Sequence[Any], identities: Sequence[str | None],
                     rank_offsets: Sequence[int], world_size: int) -> WeightGroupSpec:
        """The group of exactly these engines (EngineClients), built now unless the current one is it."""
        members = tuple(Member(e.url, offset, identity) for e, offset, identity in zip(engines, rank_offsets, identities))
        if self._valid and self.spec is not None and members == self.members:
            return self.spec
        if self.spec is not None:
            changed = sorted({m.url for m in set(members) ^ set(self.members)})
            log.info("weight-update group %s: rebuilt (%s)", self.spec.group_name,
                     f"engines changed: {', '.join(changed)}" if changed else "it failed or an engine rejoined")
        await self._destroy(engines)
        address, port = await self.trainer.ask("weight_master", timeout=self.timeout)
        self.inits += 1
        # A new name per build: a collective still stuck on the last group (a failed sync) is not this one.
        spec = WeightGroupSpec(master_address=address, master_port=port, world_size=world_size,
                               group_name=f"weights-g{self.inits}", backend=self.backend, timeout=self.timeout)
        self.spec, self.members, self._valid = spec, members, False
        await join_group(self.trainer, engines, spec, rank_offsets, timeout=self.timeout)
        self._valid = True
        return spec

    def forget(self) -> None:
        """The next ``ensure`` builds a new group (this one failed, or an engine in it restarted)."""
        self._valid = False

    async def close(self, engines: Sequence[Any]) -> None:
        """Tear the group down on the trainer and on ``engines`` (best effort: at shutdown)."""
        await self._destroy(engines)

    async def _destroy(self, engines: Sequence[Any]) -> None:
        if self.spec is None:
            return
        name, urls = self.spec.group_name, [m.url for m in self.members]
        self.spec, self.members, self._valid = None, (), False
        # Every old member, also one no longer in ``engines`` (marked down or removed, maybe alive
        # and holding the group). An engine that restarted or died has no such group: its error is expected.
        known = {e.url: e for e in engines}
        extra = [EngineClient(url, api_key=self.api_key, timeout=_DESTROY_TIMEOUT) for url in urls if url not in known]
        try:
            await leave_group(self.trainer, [known[url] for url in urls if url in known] + extra, name,
                              timeout=_DESTROY_TIMEOUT)
        finally:
            for client in extra:
                await client.close()


async def join_group(trainer: ActorRef, engines: Sequence[Any], spec: WeightGroupSpec,
                     rank_offsets: Sequence[int], timeout: float | None = None) -> None:
    """Trainer rank 0 and every engine join ``spec``'s group (concurrently: each waits for all;
    the first failure cancels the others)."""
    await gather_or_cancel(
        trainer.ask("init_weight_group", spec, timeout=timeout),
        *(engine.init_weights_update_group(spec.master_address, spec.master_port, offset, spec.world_size,
                                           spec.group_name, spec.backend)
          for engine, offset in zip(engines, rank_offsets, strict=True)),
    )


async def send_weights(trainer: ActorRef, engines: Sequence[Any], group_name: str, weight_version: str | None,
                       timeout: float | None = None, flattened: bool = True, flush_cache: bool = False) -> int:
    """One broadcast of the trainer's weights over an existing group; returns the tensors sent.

    The trainer broadcasts while each engine is POSTed one ``/update_weights_from_distributed``
    per bucket, in order, with that bucket's names, dtypes and shapes (``flattened``: one
    broadcast of the bucket's bytes, SGLang's ``load_format="flattened_bucket"``). Only the last
    bucket may flush the prefix cache (``flush_cache``: the engines are idle).
    """
    buckets: list[list[TensorMeta]] = await trainer.ask("weight_metadata", timeout=timeout)

    async def post_buckets(engine: Any) -> None:
        for index, bucket in enumerate(buckets):
            answer = await engine.update_weights_from_distributed(
                [m.name for m in bucket], [m.dtype for m in bucket], [list(m.shape) for m in bucket],
                group_name, weight_version, flush_cache=flush_cache and index == len(buckets) - 1,
                load_format=FLATTENED if flattened else None,
            )
            if isinstance(answer, dict) and not answer.get("success", True):
                raise RuntimeError(f"engine rejected the weight update: {answer.get('message')}")

    # The first failure (an engine's POST, the trainer's broadcast) cancels the other calls; the
    # trainer's rank itself leaves the collective at the group's timeout and destroys its side.
    results = await gather_or_cancel(
        trainer.ask("broadcast_weights", group_name, flattened=flattened, timeout=timeout),
        *(post_buckets(engine) for engine in engines),
    )
    return int(results[0])


async def leave_group(trainer: ActorRef, engines: Sequence[Any], group_name: str, timeout: float | None = None) -> None:
    """Destroy the group on the trainer and on ``engines``; failures are logged, not raised."""
    results = await gather_settled(
        trainer.ask("destroy_weight_group", group_name, timeout=timeout),
        *(engine.destroy_weights_update_group(group_name, timeout=timeout) for engine in engines),
    )
    failed = [f"{where}: {r}" for where, r in zip(["trainer", *(e.url for e in engines)], results)
              if isinstance(r, BaseException)]
    if failed:
        log.info("weight-update group %s: not destroyed everywhere (%s)", group_name, "; ".join(failed))


class DistributedTransport:
    """Trainer rank 0 broadcasts every bucket to the engines over the engine set's group (kept across
    syncs); a rejoining engine gets a one-off group of its own."""

    def __init__(self, trainer: ActorRef, timeout: float | None = 300.0, api_key: str | None = None) -> None:
        self.trainer = trainer
        self.timeout = timeout
        self.api_key = api_key
        self._group: EngineSetGroup | None = None
        self._attempts = 0  # names each rejoin's one-off group uniquely

    async def check(self, clients: Sequence[EngineClient]) -> None:
        infos = await gather_or_cancel(*(c.get_server_info(timeout=self.timeout) for c in clients))
        broadcast_layout([c.url for c in clients], infos)

    async def send(self, clients: Sequence[EngineClient], version: int, *, flush_cache: bool) -> list[object]:
        await self._broadcast(list(clients), version, flush_cache=flush_cache)
        return []

    async def rejoin(self, client: EngineClient, version: int) -> list[object]:
        # The trainer may have trained a step since the last sync: labelled with this version, those
        # weights only look older than they are, and the next sync brings the engine in line.
        # A group of its own, once: the engine set's group is rebuilt at the next sync, as this
        # engine restarted (it lost its place in that group).
        self._attempts += 1
        if self._group is not None:
            self._group.forget()
        await self._broadcast([client], version, flush_cache=False,
                              group_name=f"weights-v{version}-rejoin{self._attempts}")
        return []

    async def _broadcast(self, clients: list[EngineClient], version: int, *, flush_cache: bool,
                         group_name: str | None = None) -> None:
        infos = await gather_settled(*(c.get_server_info(timeout=self.timeout) for c in clients))
        for info in infos:
            if isinstance(info, BaseException) and not lost_connection(info):
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
                                            weight_version=str(version), timeout=self.timeout, flush_cache=flush_cache)
            else:
                if self._group is None:
                    self._group = EngineSetGroup(self.trainer, _backend(), timeout=self.timeout, api_key=self.api_key)
                spec = await self._group.ensure(clients, [engine_identity(i) for i in infos], rank_offsets, world_size)
                await send_weights(self.trainer, clients, spec.group_name, str(version), timeout=self.timeout,
                                   flush_cache=flush_cache)
        except Exception as error:
            if group_name is None and self._group is not None:
                # Its peers are out of step (the trainer's side destroyed itself): the next sync
                # builds a new group, destroying what is left of this one on the engines first.
                self._group.forget()
            answers = await gather_settled(*(_answers(c) for c in clients))
            gone = [c.url for c, up in zip(clients, answers) if up is not True]
            if not gone and not lost_connection(error):
                raise
            gone = gone or [c.url for c in clients]
            # An engine died during the collective (killed, crashed): the others may hold a part of
            # the update, so resume() keeps every engine not on this version out as stale, and the
            # watcher loads the current weights into each once it answers again. The run goes on.
            log.error("weight sync v%d: engine(s) %s went away during the broadcast (%s); each is updated "
                      "when it answers again", version, ", ".join(gone), error)

    def metrics(self) -> dict[str, float]:
        return {"perf/weight_sync_group_inits": float(self._group.inits if self._group is not None else 0)}

    async def close(self) -> None:
        """At shutdown: tear down the engine set's weight-update group (trainer and engines)."""
        if self._group is None or self._group.spec is None:
            return
        clients = [EngineClient(m.url, api_key=self.api_key, timeout=_DESTROY_TIMEOUT) for m in self._group.members]
        try:
            await self._group.close(clients)
        finally:
            for client in clients:
                await client.close()


async def update_engine_weights(
    trainer: ActorRef,
    engines: Sequence[Any],
    spec: WeightGroupSpec,
    weight_version: str | None = None,
    timeout: float | None = None,
    rank_offsets: Sequence[int] | None = None,
    flattened: bool = True,
    flush_cache: bool = True,
) -> int:
    """Distributed weight update of ``engines`` (EngineClients) from trainer rank 0 over a one-off group.

    ``rank_offsets``: each engine's first rank in the group (default one rank each: 1, 2, ...).
    Joins the group, broadcasts (``send_weights``), destroys the group. A sync keeps its group
    instead (``EngineSetGroup``). Returns the number of tensors sent.
    """
    offsets = list(rank_offsets) if rank_offsets is not None else [i + 1 for i in range(len(engines))]
    await join_group(trainer, engines, spec, offsets, timeout=timeout)
    try:
        return await send_weights(trainer, engines, spec.group_name, weight_version, timeout=timeout,
                                  flattened=flattened, flush_cache=flush_cache)
    finally:
        await leave_group(trainer, engines, spec.group_name, timeout=timeout)


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


async def _answers(client: EngineClient) -> bool:
    """Whether the engine answers its health check now (a dead one refuses the connection)."""
    try:
        return await client.health(timeout=5.0)
    except Exception:  # noqa: BLE001 - any failure to answer is "not answering"
        return False


def lost_connection(error: BaseException) -> bool:
    """Whether an engine's connection broke (it died; an owned one may already be restarting)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, EngineConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"
