"""`WeightSyncActor`: brings policy version N+1 into every engine; the loop asks it to ``sync``.

One sync: the router quiesces its engines in the run's mode (slime_async/quiesce.py), the
transport moves the trainer's weights to them, the prefix cache is flushed where the engines can be
idle, and the router confirms each engine serves the new version before it dispatches again.
Aborted requests come back to the rollout with their partial tokens and wait in the router, to
resume on the new weights; requests held in place continue on them.

SGLang dies on a cache flush while requests are in its batch, and every ``update_weights_from_*``
flushes unless told not to, so no update here flushes: after an ``abort`` or ``drain`` the engine
soon is idle, and a deferred ``/flush_cache?timeout=`` (answered once the scheduler is idle) both
waits for that and drops the old weights' prefix cache. Under ``in_place`` and ``retract`` the engine
holds requests through the update, so it is not idle then: a deferred flush is left with it, which
SGLang carries out at its next idle moment; until then the prefix cache holds KV the old weights
computed (the engine-reported logprobs, which the off-policy correction uses, are those of what it
really computed; on one H200 the train–inference |Δlogprob| of in_place runs equalled abort's).

An engine that (re)joins between syncs — an owned one restarted by its supervisor, an external one
restarted on its port — serves other weights than the current version, so the router keeps it out
as ``stale``; the actor's watcher brings each such engine to the current version alone and lets the
router confirm it. Messages run one at a time, so a sync and a rejoin never overlap (the export
directory and the trainer's weight group are what they share).

An engine that refuses the weights (``success: false``: a checkpoint it cannot load, see
refusals.py) is tried a few times with backoff, then kept out until the next version; when no
engine serves the new version and every one of them refused it, the sync fails naming each engine
and its refusal, and so does the run: nothing could generate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from actors.weight_sync.colocate import Colocation
from actors.weight_sync.delta import DeltaSyncError, DeltaTransport, PushResult
from actors.weight_sync.disk import DiskTransport
from actors.weight_sync.distributed import DistributedTransport
from actors.weight_sync.errors import NoEngineTakesWeights, WeightSyncError
from actors.weight_sync.refusals import ATTEMPTS, Refusals
from actors.weight_sync.tensor import TensorTransport
from slime_async.actor import Actor, ActorRef
from slime_async.engine_client import EngineClient, EngineHTTPError
from slime_async.quiesce import QuiesceMode, check_mode, leaves_engine_idle
from slime_async.task_group import gather_settled
from slime_async.trace import TraceRecorder

log = logging.getLogger(__name__)

TRANSPORTS = ("disk", "distributed", "delta", "tensor")
# How long a deferred flush may wait for an engine to go idle after an abort or drain: the requests
# the router aborted leave the engine's batch within a scheduler step or two.
IDLE_FLUSH_WAIT_S = 30.0


class Transport(Protocol):
    """How the trainer's weights reach engines; one per --update-weight-transport."""

    async def check(self, clients: Sequence[EngineClient]) -> None: ...
    async def send(self, clients: Sequence[EngineClient], version: int, *, flush_cache: bool) -> list[object]: ...
    async def rejoin(self, client: EngineClient, version: int) -> list[object]:
        """``version`` into one engine the router has just quiesced (abort), without a flush."""
    def metrics(self) -> dict[str, float]: ...
    async def close(self) -> None: ...


class WeightSyncActor(Actor):
    name = "weight_sync"

    def __init__(self, trainer: ActorRef, router: ActorRef, transport: str, mode: str, weights_dir: Path, *,
                 api_key: str | None = None, timeout: float | None = 300.0,
                 delta_receivers: Mapping[str, str] | None = None,
                 export_dir_check: Callable[[], Awaitable[None]] | None = None,
                 colocate: bool = False, trace: TraceRecorder | None = None, watch_interval: float = 1.0,
                 hold_dir: Path | None = None) -> None:
        super().__init__()
        if transport not in TRANSPORTS:
            raise WeightSyncError(f"--update-weight-transport: {transport!r} is not one of {', '.join(TRANSPORTS)}")
        self.router = router
        self.transport_name = transport
        self.mode: QuiesceMode = check_mode(mode)
        self.api_key = api_key
        self.timeout = timeout
        self.trace = trace or TraceRecorder.off()
        self.watch_interval = watch_interval
        self.hold_dir = hold_dir  # --debug-hold-weight-sync (see _hold)
        # --colocate: the phases around the update on the shared devices (its tensor transport).
        self.colocation = Colocation(trainer, router, api_key=api_key, timeout=timeout) if colocate else None
        self.transport: Transport = self._transport(trainer, transport, weights_dir, delta_receivers or {},
                                                    export_dir_check)
        self._version: int | None = None  # the version the engines were last brought to
        self._rejoins = 0  # engines brought to the current version after a (re)join
        self._idle_flush_failures = 0
        self._deferred_flush: asyncio.Task | None = None  # in_place / retract: the flush left with the engines
        self._deferred_flushes = 0
        self._refusals = Refusals()  # engines that answered an update with success: false

    def _transport(self, trainer: ActorRef, name: str, weights_dir: Path, delta_receivers: Mapping[str, str],
                   export_dir_check: Callable[[], Awaitable[None]] | None) -> Transport:
        if name == "disk":
            return DiskTransport(trainer, weights_dir, timeout=self.timeout, export_dir_check=export_dir_check)
        if name == "distributed":
            return DistributedTransport(trainer, timeout=self.timeout, api_key=self.api_key)
        if name == "delta":
            return DeltaTransport(trainer, weights_dir, delta_receivers, timeout=self.timeout, api_key=self.api_key)
        return self.colocation.tensors if self.colocation is not None else TensorTransport(trainer, self.timeout)

    async def on_start(self) -> None:
        # A restarted or re-registered engine gets the current weights before it gets work.
        self.spawn(self._watch(), name=f"{self.name}:watch")

    async def on_stop(self) -> None:
        await self.transport.close()  # the weight-update group, on the trainer and the engines

    # ----- messages ---------------------------------------------------------------------------
    async def check_engines(self) -> None:
        """Fail at start, not at the first sync, when the engines cannot take this transport."""
        if self.colocation is not None:
            return  # the layout is read at each update; the run checked the placement at start
        async with self._clients() as clients:
            await self.transport.check(clients)

    async def sync(self, version: int) -> float:
        """Bring every engine to ``version``; returns the seconds it took."""
        started = time.monotonic()
        lane = self.trace.lane("weight sync", "sync")
        sync_span = self.trace.now()
        # A drain waits for the generations in flight, which the router's per-call timeout bounds.
        with self.trace.span("pause", lane, cat="weight_sync", mode=self.mode):
            await self.router.ask("pause", self.mode, timeout=self.timeout if self.mode != "drain" else None)
        urls = [engine["url"] for engine in await self.router.ask("engines") if engine["health"] != "down"]
        # The engines are paused from here to the resume (benchmarks/gpu/chaos.py injects faults at this line).
        log.info("weight sync v%d: %s transfer to %d engine(s) begins (%s)", version, self.transport_name, len(urls),
                 self.mode)
        await self._hold(version)
        with self.trace.span(f"transfer ({self.transport_name})", lane, cat="weight_sync", engines=len(urls)):
            async with self._clients(urls) as clients:
                if self.colocation is not None:
                    await self.colocation.update_weights(clients, version)
                else:
                    self._report(clients, await self.transport.send(clients, version, flush_cache=False), version)
                    if leaves_engine_idle(self.mode):
                        await self._flush_when_idle(clients, IDLE_FLUSH_WAIT_S)
        with self.trace.span("resume", lane, cat="weight_sync"):
            states = await self.router.ask("resume", str(version), timeout=self.timeout)
        self.trace.record(f"weight sync v{version}", lane, sync_span, cat="weight_sync", version=version,
                          transport=self.transport_name, mode=self.mode)
        if self.colocation is None and not leaves_engine_idle(self.mode) and (
                self._deferred_flush is None or self._deferred_flush.done()):
            # The engines held requests through the update: their prefix cache is flushed at their
            # next idle moment (SGLang defers the flush). One such flush at a time: one still
            # pending from an earlier sync drops this sync's old prefixes too when it happens.
            self._deferred_flush = self.spawn(self._flush_when_idle_urls(urls, self.timeout),
                                              name=f"{self.name}:flush v{version}")
            self._deferred_flushes += 1
        self._version = version
        behind = {url: state for url, state in states.items() if state != "up"}
        if behind:
            log.error("weight sync v%d: engines not serving the new version: %s", version, behind)
            await self._retry_refusals_when_none_serves(version, states)
        return time.monotonic() - started

    async def _hold(self, version: int) -> None:
        """--debug-hold-weight-sync: while ``hold-v<version>`` is in the directory, wait here with the
        engines paused, so a chaos driver injects its fault inside this sync's pause (a fast transfer is
        over in milliseconds, before a driver watching the log could act) and releases it by removing
        the file. A file, not a signal or a message: the driver is another process that only reads the log."""
        if self.hold_dir is None:
            return
        hold = self.hold_dir / f"hold-v{version}"
        if not hold.exists():
            return
        log.info("weight sync v%d: held until %s is removed", version, hold)
        while hold.exists():
            await asyncio.sleep(0.05)
        log.info("weight sync v%d: released", version)

    async def refresh_stale(self) -> list[str]:
        """Load the current weights into every engine the router keeps out as stale (healthy,
        other weights: restarted), one at a time, and have the router confirm each; returns the
        URLs it brought back. Nothing to do before the first sync: an owned engine that restarts
        then serves the HF checkpoint, which is version 0."""
        if self._version is None:
            return []
        version, now = self._version, time.monotonic()
        stale = [e["url"] for e in await self.router.ask("engines") if e["health"] == "stale" and not e["paused"]]
        # One that refused this version waits out its backoff, and is not tried again once it has refused it
        # ATTEMPTS times (the next sync tries it again).
        due = [url for url in stale if self._refusals.due(url, version, now)]
        back = [url for url in due if await self._rejoin(url, version) == "up"]
        if due and not back:
            await self._fail_if_none_can_serve(version)
        return back

    def metrics(self) -> dict[str, float]:
        """What the loop logs after each step: engines brought back after a (re)join, the
        transport's own (delta: bytes on the wire; distributed: groups built), colocation's phases."""
        out = {"router/engine_rejoins": float(self._rejoins),
               "perf/weight_sync_refusals": float(self._refusals.total),
               "perf/weight_sync_engines_refusing": float(self._refusals.holding_out(self._version or 0)),
               "perf/weight_sync_idle_flush_failures": float(self._idle_flush_failures),
               "perf/weight_sync_deferred_flushes": float(self._deferred_flushes)}
        if self.colocation is not None:
            out |= self.colocation.metrics()
        return out | self.transport.metrics()

    def delta_results(self) -> list[PushResult]:
        """delta transport: each engine's transfer in the last sync or rejoin (mode, bytes, seconds)."""
        return self.transport.results if isinstance(self.transport, DeltaTransport) else []

    # colocation (--colocate): the loop hands the devices over around each step
    async def hand_devices_to_engines(self) -> None:
        """Before the first rollout: the trainer's state leaves the devices the engines generate on."""
        if self.colocation is not None:
            await self.colocation.start()

    async def hand_devices_to_trainer(self) -> dict[str, float]:
        """After a rollout: the engines free the devices and the trainer takes them (seconds of each)."""
        return await self.colocation.to_trainer() if self.colocation is not None else {}

    async def trainer_on_device(self) -> None:
        """Between steps, for work that needs the trainer's whole state (a checkpoint): onload."""
        if self.colocation is not None:
            await self.colocation.onload()

    async def trainer_off_device(self) -> None:
        if self.colocation is not None:
            await self.colocation.offload_all()

    # ----- internals --------------------------------------------------------------------------
    async def _watch(self) -> None:
        """Forever: every ``watch_interval`` s, bring engines the router holds out as stale to the
        current version (through the mailbox: never beside a sync)."""
        while True:
            await asyncio.sleep(self.watch_interval)
            try:
                await self.ref.ask("refresh_stale", timeout=None)
            except NoEngineTakesWeights as error:
                self.fail(error)  # every engine refused the current weights: nothing can generate
                return
            except Exception as error:  # noqa: BLE001 - the next round tries again; the run goes on
                log.warning("weight sync: updating a rejoined engine failed: %s", error)

    async def _rejoin(self, url: str, version: int) -> str:
        started = self.trace.now()
        await self.router.ask("pause", "abort", urls=[url], timeout=self.timeout)
        try:
            async with self._clients([url]) as (client,):
                try:
                    if self.colocation is not None:
                        await self.colocation.rejoin(client, version)
                        results: list[object] = []
                    else:
                        results = await self.transport.rejoin(client, version)
                except Exception as error:  # noqa: BLE001 - a refusal is counted; anything else goes on up
                    if _refusal(error) is None:
                        raise
                    results = [error]  # the distributed transport raises the engine's refusal
                self._report([client], results, version)
                await self._flush_when_idle([client], IDLE_FLUSH_WAIT_S)
        finally:
            states = await self.router.ask("resume", str(version), urls=[url], timeout=self.timeout)
        state = states.get(url, "unknown")
        self.trace.record(f"rejoin v{version}", self.trace.lane("weight sync", "sync"), started, cat="weight_sync",
                          engine=url, version=version, transport=self.transport_name, state=state)
        if state == "up":
            self._rejoins += 1
            log.warning("engine %s rejoined with other weights: loaded the current weights (v%d) into it", url, version)
        elif not self._refusals.refused(url, version):  # a refusal was logged with the engine's own message
            log.error("engine %s rejoined with other weights; loading v%d into it left it %s", url, version, state)
        return state

    async def _flush_when_idle(self, clients: Sequence[EngineClient], wait_s: float | None) -> None:
        """Drop the old weights' prefix cache once each engine is idle (SGLang defers the flush to
        then, up to ``wait_s``). An engine that stays busy keeps serving; a later sync flushes it."""
        results = await gather_settled(*(c.flush_cache(wait_idle_s=wait_s, timeout=(wait_s or 0) + 30)
                                         for c in clients))
        for client, result in zip(clients, results):
            if isinstance(result, BaseException):
                self._idle_flush_failures += 1
                log.info("weight sync: %s kept its prefix cache (not idle for the flush): %s", client.url, result)

    async def _flush_when_idle_urls(self, urls: Sequence[str], wait_s: float | None) -> None:
        async with self._clients(urls) as clients:
            await self._flush_when_idle(clients, wait_s)

    def _clients(self, urls: Sequence[str] | None = None) -> _Clients:
        return _Clients(self.router, urls, self.api_key)

    def _report(self, clients: Sequence[EngineClient], results: Sequence[object], version: int) -> None:
        failures = []
        now = time.monotonic()
        for client, result in zip(clients, results):
            refusal = _refusal(result)
            if refusal is not None:
                count = self._refusals.record(client.url, version, refusal, now)
                left = "retried after a backoff" if count < ATTEMPTS else "kept out until the next version"
                log.error("weight sync v%d: engine %s refused the weights (try %d of %d; %s): %s", version, client.url,
                          count, ATTEMPTS, left, refusal)
            elif isinstance(result, BaseException):
                failures.append(f"{client.url}: {result}")
            else:
                self._refusals.accepted(client.url)
        if failures:
            # The router's resume() keeps such engines out as stale; the watcher retries each.
            log.error("weight update failed on %d engine(s): %s", len(failures), "; ".join(failures))

    async def _retry_refusals_when_none_serves(self, version: int, states: Mapping[str, str]) -> None:
        """No engine serves ``version``: when each refused it (none is merely down: a restarting one
        gets it when it answers again), retry them after their backoff until one takes it or each has
        refused it ATTEMPTS times; then raise NoEngineTakesWeights, naming them and their refusals."""
        if any(state == "up" for state in states.values()):
            return
        while True:
            urls = await self._fail_if_none_can_serve(version)
            if not urls:
                return  # an engine is up, or one that did not refuse may still come back
            now = time.monotonic()
            waiting = [url for url in urls if not self._refusals.exhausted(url, version)]
            await asyncio.sleep(min(self._refusals.wait(url, version, now) for url in waiting))
            for url in waiting:
                if not self._refusals.due(url, version, time.monotonic()):
                    continue
                try:
                    if await self._rejoin(url, version) == "up":
                        return
                except Exception as error:  # noqa: BLE001 - e.g. it died meanwhile: down, not refusing (next round)
                    log.warning("weight sync v%d: retrying %s failed: %s", version, url, error)

    async def _fail_if_none_can_serve(self, version: int) -> list[str]:
        """Raise NoEngineTakesWeights when no engine serves ``version`` and every one refused it as
        often as it is tried. Returns the engines' URLs when each refused it but some have tries
        left, else [] (an engine is up, or one did not refuse: it is down or was never tried)."""
        engines = await self.router.ask("engines")
        urls = [engine["url"] for engine in engines]
        if not urls or any(engine["health"] == "up" for engine in engines) or not all(
                self._refusals.refused(url, version) for url in urls):
            return []
        if all(self._refusals.exhausted(url, version) for url in urls):
            raise NoEngineTakesWeights(f"weight sync v{version}: no engine can serve the new weights, every one "
                                       f"refused them: {self._refusals.describe(urls, version)}")
        return urls


def _refusal(result: object) -> str | None:
    """The engine's own message when ``result`` is its refusal of the weights (it answered
    ``success: false`` or an error status), else None (it took them, or could not be reached)."""
    if isinstance(result, dict) and result.get("success") is False:
        return str(result.get("message"))
    if isinstance(result, EngineHTTPError):
        return result.message
    if isinstance(result, DeltaSyncError) and result.__cause__ is None:
        return str(result)  # the receiver answered (a connection failure is the cause of the others)
    return None


class _Clients:
    """``async with``: an EngineClient per URL (default: every engine the router has) on one session."""

    def __init__(self, router: ActorRef, urls: Sequence[str] | None, api_key: str | None) -> None:
        self.router, self.urls, self.api_key = router, urls, api_key
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> list[EngineClient]:
        urls = self.urls if self.urls is not None else [e["url"] for e in await self.router.ask("engines")]
        self._session = aiohttp.ClientSession()
        return [EngineClient(url, session=self._session, api_key=self.api_key) for url in urls]

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._session is not None:
            await self._session.close()
