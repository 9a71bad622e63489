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

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from actors.trainer.protocol import TensorMeta, WeightGroupSpec
from slime_async.actor import ActorRef
from slime_async.engine_client import EngineClient
from slime_async.task_group import gather_or_cancel

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
                       timeout: float | None = None, flattened: bool = True) -> int:
    """One broadcast of the trainer's weights over an existing group; returns the tensors sent.

    The trainer broadcasts while each engine is POSTed one ``/update_weights_from_distributed``
    per bucket, in order, with that bucket's names, dtypes and shapes (``flattened``: one
    broadcast of the bucket's bytes, SGLang's ``load_format="flattened_bucket"``).
    """
    buckets: list[list[TensorMeta]] = await trainer.ask("weight_metadata", timeout=timeout)

    async def post_buckets(engine: Any) -> None:
        for bucket in buckets:
            answer = await engine.update_weights_from_distributed(
                [m.name for m in bucket], [m.dtype for m in bucket], [list(m.shape) for m in bucket],
                group_name, weight_version, load_format=FLATTENED if flattened else None,
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
    results = await asyncio.gather(
        trainer.ask("destroy_weight_group", group_name, timeout=timeout),
        *(engine.destroy_weights_update_group(group_name, timeout=timeout) for engine in engines),
        return_exceptions=True,
    )
    failed = [f"{where}: {r}" for where, r in zip(["trainer", *(e.url for e in engines)], results)
              if isinstance(r, BaseException)]
    if failed:
        log.info("weight-update group %s: not destroyed everywhere (%s)", group_name, "; ".join(failed))
