"""RouterActor: sends each generate request to one engine, session-affine and load-aware.

The engine choice is ``policies.routing.choose_engine``; this actor holds what it needs (engine
health and load, the session table) and does the I/O around it:

- ``generate`` picks an engine, sends the request, and on a connection error marks the engine
  down and re-sends the request to another one. A response the dead engine had partly
  generated is lost: the retry generates from the original prompt again.
- a health loop calls ``/health_generate`` every ``--router-health-interval``; an engine with
  ``--router-health-failures`` consecutive failures is marked down, and a down engine rejoins
  when a check succeeds again (and, after a weight sync, when it reports the expected weight
  version). Sessions bound to a down engine are re-placed when their next request comes.
- a load loop polls ``/v1/loads`` so load from other clients of an engine counts too.
- ``pause``/``resume`` bracket a weight update: from ``pause`` until ``resume`` has confirmed
  an engine's weight version, nothing at all is sent to that engine; requests wait in the router.
  The mode is one of slime_async/quiesce.py's: ``in_place`` and ``retract`` leave the requests
  already on an engine there (the engine itself pauses them, SGLang ``pause_generation``) and
  ``resume`` continues them on the new weights.
- ``engine_capacities`` reports what each engine can hold at once (``/server_info``, read when
  it is admitted), from which the rollout sizes its concurrency (``policies.concurrency``);
  with ``wait_for_first_read`` it answers once the start's reads are in (each bounded by
  ``--router-health-timeout``), so that the rollout's first limit does not depend on timing.

Concurrency: handlers run one at a time in the mailbox; request tasks (``defer``) and the
loops mutate state only in the synchronous stretches between their awaits, which the
single-threaded event loop serialises just like the mailbox does. That keeps the routing hop a
plain function call instead of a second mailbox round trip per request.

One actor, several files: the request path (pick, send, fail over, record) is dispatch.py, the
health and load loops health.py, what the router knows of one engine engine_state.py; this file
holds the handlers, the weight-sync pause and resume, and the engines' state changes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import aiohttp

from actors.router.config import RouterConfig
from actors.router.dispatch import RequestPath
from actors.router.engine_state import EngineState, Health, engine_tag, normalize_url
from actors.router.errors import NoEngineAvailable, RouterError  # noqa: F401 - exported (actors.router)
from actors.router.health import HealthChecks
from actors.router.http_front import HttpFront
from actors.router.text_model import TextModel
from actors.router.sessions import SessionTable
from policies.concurrency import EngineCapacity
from policies.routing import RoutingPolicy
from slime_async.actor import Actor, Deferred
from slime_async.engine_client import (
    EngineClient,
    EngineError,
    RetryPolicy,
    new_engine_session,
)
from slime_async.quiesce import QuiesceMode, check_mode, engine_pause_mode
from slime_async.task_group import gather_or_cancel, gather_settled
from slime_async.trace import TraceRecorder

log = logging.getLogger(__name__)


class RouterActor(RequestPath, HealthChecks, Actor):
    name = "router"

    def __init__(
        self,
        config: RouterConfig,
        engines: Sequence[str] = (),
        *,
        api_key: str | None = None,
        model: TextModel | None = None,
        name: str | None = None,
        trace: TraceRecorder | None = None,
    ):
        """``model`` (tokenizer and chat template) turns on the HTTP front (http_front.py) at
        ``--router-host``/``--router-port``; ``api_key`` is the engines' key. ``config`` is
        validated where it is parsed (``slime-async train``, ``slime-async router``). ``trace``
        (--trace-dir): every request sent to an engine is a span on that engine's lanes."""
        super().__init__(name)
        self.config = config
        self.policy = RoutingPolicy(config.router_policy)
        self._initial_urls = [normalize_url(url) for url in engines]
        self._api_key = api_key
        self._engines: dict[str, EngineState] = {}
        self._sessions = SessionTable(config.router_max_sessions)
        self._cursor = 0  # requests routed so far (round-robin position)
        self._counters: Counter[str] = Counter()
        self._expected_version: str | None = None  # set by resume(); engines must match it
        self._pause_all = False  # a pause of every engine also holds engines that join meanwhile
        self._changed = asyncio.Event()
        self._http: aiohttp.ClientSession | None = None
        self._front = HttpFront(config, model) if model is not None else None
        self._trace = trace or TraceRecorder.off()
        self._first_capacities: asyncio.Task | None = None  # the start's /server_info reads

    # ----- lifecycle -------------------------------------------------------------------------
    async def on_start(self) -> None:
        self._http = new_engine_session()  # one connection pool for every engine
        for url in self._initial_urls:
            self._add(url, Health.UP)
        # In the background: an engine slow to answer must not hold up the start (unknown meanwhile).
        self._first_capacities = self.spawn(self._read_capacities(list(self._engines.values())),
                                            name=f"{self.name}:capacities")
        self.spawn(self._health_loop(), name=f"{self.name}:health")
        if self.config.router_load_interval > 0:
            self.spawn(self._load_loop(), name=f"{self.name}:loads")
        if self._front is not None:
            try:
                await self._front.start(self.ref)
            except BaseException:
                await self._http.close()
                raise

    async def on_stop(self) -> None:
        if self._front is not None:
            await self._front.stop()
        if self._http is not None:
            await self._http.close()

    # ----- handlers: requests ----------------------------------------------------------------
    def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        session_id: str | None = None,
        rid: str | None = None,
        return_logprob: bool = True,
        trace_args: dict[str, Any] | None = None,
        top_logprobs_num: int = 0,
        logprob_start_len: int | None = None,
        return_routed_experts: bool = False,
    ) -> Deferred:
        """Generate on one engine; returns SGLang's response dict plus ``engine_url``.

        Call it as ``await router.ask("generate", ids, params, session_id=..., timeout=None)``:
        a request may wait for a weight sync or a long generation. After a connection error
        the request is sent again, from ``input_ids``, to another engine: whatever the dead
        engine had generated is lost. An aborted request (pause "abort") returns normally with
        ``finish_reason.type == "abort"`` and the tokens so far. ``trace_args`` (the sample's
        ids, ...) go on the request's span in the --trace-dir timeline. ``top_logprobs_num``:
        SGLang's field, each output token's most likely alternatives too. ``logprob_start_len``:
        SGLang's prompt logprobs from there on (``meta_info.input_token_logprobs``).
        ``return_routed_experts``: SGLang's field, the experts of every position (``meta_info.routed_experts``)."""
        if input_ids and isinstance(input_ids[0], list):
            raise ValueError("router.generate takes one prompt (a list of token ids), not a batch")
        return self.defer(self._serve(input_ids, sampling_params, session_id, rid, return_logprob, trace_args,
                                      top_logprobs_num, logprob_start_len, return_routed_experts))

    def end_session(self, session_id: str) -> None:
        """Forget a finished session (its affinity is no longer worth anything)."""
        self._sessions.forget(session_id)
        if self._front is not None:
            self._front.recorder.forget(session_id)

    # ----- handlers: the HTTP front ------------------------------------------------------------
    def front_url(self) -> str | None:
        """Base URL of the HTTP front (``http://host:port``), None when it is off."""
        return self._front.url if self._front is not None else None

    def take_trajectory(self, session_id: str) -> list:
        """The recorded turns of a session (``slime_async.trajectory.RecordedTurn``); the session
        is forgotten. Raises LookupError when nothing (or not everything) was kept."""
        if self._front is None:
            raise RuntimeError("router: the HTTP front is off, so nothing was recorded")
        self._sessions.forget(session_id)
        return self._front.recorder.take(session_id)

    # ----- handlers: weight sync -------------------------------------------------------------
    def pause(self, mode: QuiesceMode = "abort", urls: Sequence[str] | None = None) -> Deferred:
        """Stop dispatching to ``urls`` (all engines by default) and return once nothing of
        ours runs on them: ``abort`` aborts in-flight requests (they return to their callers
        with finish_reason abort and the tokens so far), ``drain`` lets them finish. New
        requests wait in the router until ``resume``. ``in_place`` and ``retract`` instead have
        each engine pause them where they are and return at once; ``resume`` continues them."""
        check_mode(mode, "router.pause")
        targets = self._select(urls)
        if urls is None:
            self._pause_all = True
        for engine in targets:
            engine.paused = True
        return self.defer(self._quiesce(targets, mode))

    def resume(self, expected_version: str | int | None, urls: Sequence[str] | None = None) -> Deferred:
        """Confirm each paused engine in ``urls`` reports ``weight_version == expected_version``
        and route to it again; an engine that mismatches is kept out as ``stale`` (it rejoins
        when it reports the version), one that does not answer is marked down.
        Returns ``{url: state}``."""
        targets = self._select(urls)
        if urls is None:
            self._pause_all = False
        if expected_version is not None:
            self._expected_version = str(expected_version)
        return self.defer(self._confirm(targets, expected_version is not None))

    # ----- handlers: membership and state ------------------------------------------------------
    def register_engine(self, url: str) -> Deferred:
        """Add an engine, or re-check a known one (e.g. restarted by its supervisor); it is
        routed to once it passes a health check (and the weight-version check after a sync).
        Returns its description."""
        url = normalize_url(url)
        engine = self._engines.get(url)
        if engine is None:
            engine = self._add(url, Health.DOWN, reason="registered, not yet checked")
            engine.paused = self._pause_all
        return self.defer(self._admit(engine))

    def remove_engine(self, url: str) -> dict[str, Any]:
        """Stop routing to ``url``; its requests in flight finish, its sessions are re-placed."""
        url = normalize_url(url)
        engine = self._engines.pop(url, None)
        if engine is None:
            raise KeyError(f"router: no engine {url} (known: {sorted(self._engines)})")
        log.info("router: removed engine %s", url)
        self._notify()  # drain waiters may be waiting on it
        return engine.describe()

    def engines(self) -> list[dict[str, Any]]:
        """Every engine: url, state (up / down / stale / paused), load and counters."""
        return [engine.describe() for engine in self._engines.values()]

    def engine_capacities(self, wait_for_first_read: bool = False) -> list[EngineCapacity | None] | Deferred:
        """What each engine not marked down can hold at once (None: not known yet); paused and
        stale ones count, they are back after a sync. ``wait_for_first_read``: answer once the
        start's reads have finished (bounded: each read times out after --router-health-timeout)."""
        if wait_for_first_read and self._first_capacities is not None and not self._first_capacities.done():
            return self.defer(self._capacities_after_first_read())
        return self._capacities()

    async def _capacities_after_first_read(self) -> list[EngineCapacity | None]:
        await asyncio.shield(self._first_capacities)
        return self._capacities()

    def _capacities(self) -> list[EngineCapacity | None]:
        return [engine.capacity for engine in self._engines.values() if engine.health is not Health.DOWN]

    def metrics(self) -> dict[str, float]:
        """``router/*`` scalars for the monitor (cumulative counters and current gauges)."""
        out: dict[str, float] = {}
        prompt = cached = 0
        for engine in self._engines.values():
            tag = f"router/{engine_tag(engine.url)}"
            out[f"{tag}/requests"] = engine.requests
            out[f"{tag}/in_flight"] = engine.in_flight
            out[f"{tag}/load"] = engine.load
            out[f"{tag}/errors"] = engine.errors
            out[f"{tag}/up"] = float(engine.routable)
            out[f"{tag}/sessions"] = self._sessions.bound[engine.url]
            out[f"{tag}/sessions_moved_out"] = self._counters[f"moved_out:{engine.url}"]
            out[f"{tag}/prefix_cache_hit_rate"] = _ratio(engine.cached_tokens, engine.prompt_tokens)
            prompt += engine.prompt_tokens
            cached += engine.cached_tokens
        engines = self._engines.values()
        out["router/requests"] = sum(engine.requests for engine in engines)
        out["router/in_flight"] = sum(engine.in_flight for engine in engines)
        out["router/errors"] = sum(engine.errors for engine in engines)
        out["router/engines_up"] = sum(engine.routable for engine in engines)
        out["router/sessions"] = len(self._sessions)
        out["router/session_moves"] = self._counters["session_moves"]
        out["router/retries"] = self._counters["retries"]
        out["router/engine_down_events"] = self._counters["engine_down"]
        out["router/prefix_cache_hit_rate"] = _ratio(cached, prompt)
        if self._front is not None:
            out.update(self._front.metrics())
        for key, count in self._counters.items():
            if key.startswith("reason:"):  # how requests were routed: affinity, placed, ...
                out[f"router/routed_{key.removeprefix('reason:')}"] = count
        return out

    # ----- weight sync ----------------------------------------------------------------------------
    async def _quiesce(self, targets: list[EngineState], mode: QuiesceMode) -> dict[str, str]:
        engine_mode = engine_pause_mode(mode)
        if engine_mode is not None:
            await gather_or_cancel(*(self._pause_in_place(engine, engine_mode) for engine in targets))
            return {engine.url: engine.state for engine in targets}
        interval = self.config.router_abort_interval
        while True:
            busy = [engine for engine in targets if engine.in_flight and engine.url in self._engines]
            if not busy:
                return {engine.url: engine.state for engine in targets}
            if mode == "abort":
                # Repeated: a request sent just before the pause may reach the engine after
                # the first abort_all.
                await gather_or_cancel(*(self._abort_all(engine) for engine in busy))
            await self._next_change(interval if mode == "abort" else None)

    async def _pause_in_place(self, engine: EngineState, engine_mode: str) -> None:
        """The engine holds its requests through the update (SGLang ``pause_generation``
        ``in_place``: with their KV; ``retract``: back in its queue)."""
        if engine.health is Health.DOWN:
            return  # nothing of ours runs there; resume() checks it like any other
        try:
            version = engine.weight_version or await self._weight_version(engine)
            await engine.client.pause_generation(engine_mode, timeout=self.config.router_health_timeout)
        except EngineError as error:
            # Its requests fail over when their connections break; resume() re-checks it.
            self._mark_down(engine, f"in-place pause failed: {error}")
            return
        engine.paused_in_place = True
        engine.in_place_pauses += 1
        engine.last_in_place_pause_version = str(version)

    async def _continue(self, engine: EngineState) -> bool:
        """Continue an engine paused in place; one that refuses is taken down (see _take_down):
        its requests would otherwise wait on it forever while it passes every version check."""
        try:
            await engine.client.continue_generation(timeout=self.config.router_health_timeout)
        except EngineError as error:
            self._take_down(engine, f"continue_generation failed: {error}")
            return False
        engine.paused_in_place = False
        return True

    async def _abort_all(self, engine: EngineState) -> None:
        try:
            await engine.client.abort_request(abort_all=True, timeout=self.config.router_health_timeout)
        except EngineError as error:
            # A dead engine's requests fail with connection errors instead; nothing to do.
            log.warning("router: abort on %s failed: %s", engine.url, error)

    async def _confirm(self, targets: list[EngineState], check_version: bool) -> dict[str, str]:
        # Engines paused in place continue their requests first (on the weights now loaded).
        await gather_or_cancel(*(self._continue(e) for e in targets if e.paused_in_place))
        versions = await gather_settled(*(self._weight_version(engine) for engine in targets if check_version))
        for index, engine in enumerate(targets):
            engine.paused = False
            if not check_version:
                continue
            version = versions[index]
            if engine.paused_in_place:
                continue  # its continue failed: down until the health loop gets it to continue
            if isinstance(version, BaseException):
                self._mark_down(engine, f"weight version check failed: {version}")
            elif version != self._expected_version:
                self._mark_stale(engine, version)
            else:
                engine.weight_version = version
                self._mark_up(engine)
        self._notify()
        return {engine.url: engine.state for engine in targets}

    async def _weight_version(self, engine: EngineState) -> str | None:
        return await engine.client.get_weight_version(timeout=self.config.router_health_timeout)

    # ----- state changes --------------------------------------------------------------------------
    def _add(self, url: str, health: Health, reason: str = "") -> EngineState:
        client = EngineClient(
            url,
            session=self._http,
            api_key=self._api_key,
            # One attempt: the router itself fails over to another engine, at once.
            retry=RetryPolicy(attempts=1),
        )
        engine = EngineState(url=url, client=client, health=health, down_reason=reason)
        self._engines[url] = engine
        log.info("router: engine %s registered (%s)", url, engine.state)
        return engine

    def _mark_up(self, engine: EngineState) -> None:
        if engine.health is not Health.UP:
            log.info("router: engine %s is up again", engine.url)
        engine.health = Health.UP
        engine.down_reason = ""
        engine.external_load = 0.0
        self._notify()

    def _mark_down(self, engine: EngineState, reason: str) -> None:
        if engine.health is Health.UP:
            log.warning("router: engine %s marked down: %s", engine.url, reason)
            self._counters["engine_down"] += 1
        engine.health = Health.DOWN
        engine.down_reason = reason

    def _take_down(self, engine: EngineState, reason: str) -> None:
        """Mark down and abandon its calls (they fail over): a hung or paused engine would hold
        them forever."""
        self._mark_down(engine, reason)
        for call in list(engine.calls):
            call.cancel()

    def _mark_stale(self, engine: EngineState, version: str | None) -> None:
        if engine.health is not Health.STALE:
            log.error(
                "router: engine %s reports weight_version %s, expected %s: not routed until it matches",
                engine.url, version, self._expected_version,
            )
        engine.health = Health.STALE
        engine.down_reason = f"weight_version {version}, expected {self._expected_version}"

    def _select(self, urls: Sequence[str] | None) -> list[EngineState]:
        if urls is None:
            return list(self._engines.values())
        selected = []
        for url in urls:
            engine = self._engines.get(normalize_url(url))
            if engine is None:
                raise KeyError(f"router: no engine {url} (known: {sorted(self._engines)})")
            selected.append(engine)
        return selected

    def _notify(self) -> None:
        """Wake everything waiting for an engine to become routable or quiet."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def _next_change(self, timeout: float | None) -> None:
        changed = self._changed
        try:
            async with asyncio.timeout(timeout):
                await changed.wait()
        except TimeoutError:
            pass


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0
