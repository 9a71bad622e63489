"""The router's request path: pick an engine, send the /generate call, fail over, record the answer.

A part of ``RouterActor`` (actor.py), kept in its own module: the methods here run in the
actor's request tasks and use its state (``config``, ``policy``, ``_engines``, ``_sessions``,
``_cursor``, ``_counters``, ``_expected_version``, ``_trace``) and its state changes
(``_mark_down``, ``_mark_stale``, ``_notify``, ``_next_change``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from actors.router.engine_state import EngineState, engine_tag
from actors.router.errors import NoEngineAvailable, RouterError
from policies.routing import choose_engine
from slime_async.engine_client import EngineConnectionError, EngineError
from slime_async.sample import policy_version


class RequestPath:
    """``RouterActor``'s methods that serve one generate request (see the module docstring)."""

    async def _serve(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        session_id: str | None,
        rid: str | None,
        return_logprob: bool,
        trace_args: dict[str, Any] | None = None,
        top_logprobs_num: int = 0,
        logprob_start_len: int | None = None,
        return_routed_experts: bool = False,
    ) -> dict[str, Any]:
        retries_left = self.config.router_request_retries
        failures: list[str] = []
        while True:
            engine = self._pick(session_id) or await self._wait_for_engine(session_id)
            engine.in_flight += 1
            sent, response = self._trace.now(), None
            pauses_before, version_at_send = engine.in_place_pauses, engine.weight_version
            try:
                response = await self._send(engine, input_ids, sampling_params, rid, return_logprob,
                                            top_logprobs_num, logprob_start_len, return_routed_experts)
            except EngineConnectionError as error:
                engine.errors += 1
                self._mark_down(engine, str(error))
                failures.append(str(error))
                if retries_left == 0:
                    raise RouterError(
                        f"router: request failed on {len(failures)} engine(s) "
                        f"(--router-request-retries {self.config.router_request_retries}): "
                        + "; ".join(failures)
                    ) from error
                retries_left -= 1
                self._counters["retries"] += 1
                continue
            except EngineError:
                engine.errors += 1
                raise
            finally:
                engine.in_flight -= 1
                self._trace_request(engine, sent, len(input_ids), response, trace_args)
                if engine.paused:
                    self._notify()  # a pause may be waiting for this engine to go quiet
            if engine.in_place_pauses > pauses_before:
                _label_in_place_span(response, version_at_send or engine.last_in_place_pause_version)
            self._record(engine, response)
            response["engine_url"] = engine.url
            return response

    async def _send(
        self,
        engine: EngineState,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        rid: str | None,
        return_logprob: bool,
        top_logprobs_num: int = 0,
        logprob_start_len: int | None = None,
        return_routed_experts: bool = False,
    ) -> dict[str, Any]:
        """One /generate call that the health loop can abandon: when it marks the engine down
        (a hung engine keeps connections open but never answers), the call ends with an
        EngineConnectionError and the request fails over like after a refused connection.
        Streamed with --router-stream-generate, for each output token's weight version (the
        engine's ``version_lag``: the tokens its chunks report late, see StreamAssembler)."""
        call = asyncio.create_task(  # owned by engine.calls: the health loop cancels a hung engine's
            engine.client.generate(
                input_ids,
                sampling_params,
                return_logprob=return_logprob,
                rid=rid,
                timeout=self.config.router_request_timeout,
                stream=self.config.router_stream_generate is True,
                version_lag=engine.version_lag,
                top_logprobs_num=top_logprobs_num,
                logprob_start_len=logprob_start_len,
                return_routed_experts=return_routed_experts,
            )
        )
        engine.calls.add(call)
        try:
            return await call
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # the request itself was cancelled (the router stops)
            raise EngineConnectionError(
                engine.url, "/generate", None, f"abandoned: engine marked down ({engine.down_reason})"
            ) from None
        finally:
            engine.calls.discard(call)

    def _trace_request(self, engine: EngineState, sent: float, prompt_tokens: int, response: dict[str, Any] | None,
                       trace_args: dict[str, Any] | None) -> None:
        """The request's span on its engine's lanes (one per request in flight there)."""
        if not self._trace.enabled:
            return
        meta = (response or {}).get("meta_info") or {}
        finish = meta.get("finish_reason")
        args = dict(trace_args or {}) | {
            "prompt_tokens": prompt_tokens, "completion_tokens": meta.get("completion_tokens"),
            "version": policy_version(meta["weight_version"]) if "weight_version" in meta else None,
            "finish": finish.get("type") if isinstance(finish, dict) else ("error" if response is None else None)}
        self._trace.record("generate", self._trace.pool(f"engine {engine_tag(engine.url)}", "request"), sent,
                           cat="generate", **args)

    def _pick(self, session_id: str | None) -> EngineState | None:
        """Choose and bind an engine now, or None when no engine is routable."""
        loads = {url: engine.load for url, engine in self._engines.items() if engine.routable}
        if not loads:
            return None
        route = choose_engine(
            self.policy,
            session_id,
            loads,
            self._sessions,
            imbalance_threshold=self.config.router_imbalance_threshold,
            bound=self._sessions.bound,
            cursor=self._cursor,
        )
        self._cursor += 1
        self._counters[f"reason:{route.reason.value}"] += 1
        if session_id is not None:
            self._sessions.bind(session_id, route.engine)
        if route.moved:
            self._counters["session_moves"] += 1
            self._counters[f"moved_out:{route.previous}"] += 1
        return self._engines[route.engine]

    async def _wait_for_engine(self, session_id: str | None) -> EngineState:
        """Wait until an engine is routable: without limit while a weight sync holds engines
        paused, else at most ``--router-no-engine-timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            engine = self._pick(session_id)
            if engine is not None:
                return engine
            if any(engine.paused for engine in self._engines.values()):
                deadline, remaining = None, None
            else:
                if deadline is None:
                    deadline = loop.time() + self.config.router_no_engine_timeout
                remaining = deadline - loop.time()
                if remaining <= 0:
                    states = ", ".join(f"{e.url}: {e.state} {e.down_reason}".strip() for e in self._engines.values())
                    raise NoEngineAvailable(
                        f"router: no healthy engine for {self.config.router_no_engine_timeout:g} s "
                        f"(--router-no-engine-timeout); engines: {states or 'none registered'}"
                    )
            await self._next_change(remaining)

    def _record(self, engine: EngineState, response: dict[str, Any]) -> None:
        engine.requests += 1
        meta = response.get("meta_info") or {}
        engine.prompt_tokens += int(meta.get("prompt_tokens") or 0)
        engine.cached_tokens += int(meta.get("cached_tokens") or 0)
        version = meta.get("weight_version")
        if version is None:
            return
        engine.weight_version = str(version)
        # An engine restarted between two health checks comes back with its initial weights;
        # its first answer gives it away.
        if self._expected_version is not None and engine.weight_version != self._expected_version:
            self._mark_stale(engine, engine.weight_version)


def _label_in_place_span(response: dict[str, Any], version_before: str) -> None:
    """A request that ran across an in-place sync, when the answer does not say which of its
    tokens came before it: all of them get the version before the first such sync, so that no
    token looks newer (and its staleness smaller) than it is. The answer does say when the engine
    reports the split itself (the CPU engine's ``weight_version_segments``) or when the router
    streamed the request (--router-stream-generate) from an engine whose chunks name their
    version (SGLang's do); only a plain answer from SGLang, which names one version, the one at
    its end, gets this fallback."""
    meta = response.setdefault("meta_info", {})
    if "weight_version_segments" in meta:
        return
    n_tokens = len(meta.get("output_token_logprobs") or response.get("output_ids") or [])
    meta["weight_version_segments"] = [[version_before, n_tokens]] if n_tokens else []
