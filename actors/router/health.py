"""The router's health and load loops: which engines are routable, and how busy each one is.

A part of ``RouterActor`` (actor.py), kept in its own module: the loops run as tasks the actor
owns and use its state (``config``, ``_engines``, ``_expected_version``) and its state changes
(``_mark_up``, ``_mark_down``, ``_take_down``, ``_mark_stale``); an engine still paused in place
after a sync is continued first (``_continue``, the actor's weight-sync code).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from actors.router.engine_state import EngineState, Health, reported_capacity, reported_load, reported_version_lag
from slime_async.engine_client import EngineError, EngineHTTPError
from slime_async.task_group import gather_or_cancel

log = logging.getLogger(__name__)

# Per /v1/loads poll, the external-load estimate falls 30% of the way to a lower sample.
LOAD_DECAY = 0.7


class HealthChecks:
    """``RouterActor``'s health checks, admission and load polls (see the module docstring)."""

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.router_health_interval)
            checked = [engine for engine in self._engines.values() if not engine.paused]
            await gather_or_cancel(*(self._check(engine) for engine in checked))

    async def _check(self, engine: EngineState) -> None:
        if engine.paused_in_place and not await self._continue(engine):
            return  # its continue after a sync failed again: down (a paused engine fails health checks anyway)
        ok = await engine.client.health_generate(timeout=self.config.router_health_timeout)
        if engine.paused or self._engines.get(engine.url) is not engine:
            return  # paused or removed meanwhile: the answer no longer matters
        if not ok:
            engine.health_failures += 1
            if engine.health is Health.UP and engine.health_failures >= self.config.router_health_failures:
                self._take_down(engine, f"{engine.health_failures} failed health checks")
            return
        engine.health_failures = 0
        if engine.health is not Health.UP:
            await self._read_capacity(engine)  # back after being down: maybe restarted with other limits
        if engine.health is not Health.UP or self._expected_version is not None:
            await self._verify_and_admit(engine)

    async def _admit(self, engine: EngineState) -> dict[str, Any]:
        if not engine.paused:
            if await engine.client.health_generate(timeout=self.config.router_health_timeout):
                engine.health_failures = 0
                await self._read_capacity(engine)
                await self._verify_and_admit(engine)
            else:
                self._mark_down(engine, "failed its health check at registration")
        return engine.describe()

    async def _verify_and_admit(self, engine: EngineState) -> None:
        """Route to a healthy engine again, if its weights are the expected ones."""
        if self._expected_version is not None:
            try:
                version = await self._weight_version(engine)
            except EngineError as error:
                log.warning("router: %s is healthy but its weight version is unknown: %s", engine.url, error)
                return
            if engine.paused or self._engines.get(engine.url) is not engine:
                return
            engine.weight_version = version
            if version != self._expected_version:
                self._mark_stale(engine, version)
                return
        self._mark_up(engine)

    async def _read_capacities(self, engines: list[EngineState]) -> None:
        await gather_or_cancel(*(self._read_capacity(engine) for engine in engines))

    async def _read_capacity(self, engine: EngineState) -> None:
        """What the engine can hold at once; unknown (None) if it does not answer or say. Its
        /server_info also says how late its streams report tokens (``version_lag``)."""
        try:
            info = await engine.client.get_server_info(timeout=self.config.router_health_timeout)
            engine.version_lag = reported_version_lag(info)
            engine.capacity = reported_capacity(info)
        except (EngineError, ValueError) as error:
            log.info("router: %s did not report its capacity (%s); counting it as unknown", engine.url, error)

    async def _load_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.router_load_interval)
            polled = [engine for engine in self._engines.values() if engine.routable and engine.loads_supported]
            await gather_or_cancel(*(self._poll_load(engine) for engine in polled))

    async def _poll_load(self, engine: EngineState) -> None:
        try:
            total = reported_load(await engine.client.get_loads(timeout=self.config.router_health_timeout))
        except EngineHTTPError as error:
            if error.status == 404:
                log.info("router: %s has no /v1/loads; counting only the router's own requests", engine.url)
                engine.loads_supported = False
            return
        except EngineError:
            return  # the health loop deals with unreachable engines
        except ValueError as error:
            log.warning("router: ignoring /v1/loads of %s: %s", engine.url, error)
            engine.loads_supported = False
            return
        # The engine's count includes our own requests; what is beyond them is other traffic.
        sample = max(0.0, total - engine.in_flight)
        # Rise at once, fall slowly: another client's requests finish in batches and are
        # re-sent a moment later, and a session moved into such a dip would pay for it with
        # its prefix cache only to be moved back.
        engine.external_load = max(sample, LOAD_DECAY * engine.external_load + (1 - LOAD_DECAY) * sample)
