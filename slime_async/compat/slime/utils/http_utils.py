"""``slime.utils.http_utils.post`` / ``get``: JSON over HTTP, as slime's plug-ins call them.

slime keeps one process-wide httpx client; here each call opens a short-lived aiohttp session
(loopback connections cost well under a millisecond next to a generation) so there is no global
client to initialise or to leak across event loops. No timeout: a ``/generate`` waits in the
router while weights sync. Retries differ from slime's (which retries anything, 60 times): a
refused connection or a 5xx answer is retried ``max_retries`` times a second apart, a 4xx is
the request's own fault and fails at once with the server's message.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from typing import Any

import aiohttp
import orjson

log = logging.getLogger(__name__)

# (router URL, its Authorization header) for the hook running in this task, set by the rollout's
# adapter when the run has --router-api-key: slime's post() takes no key, and the header must go
# to the run's router front only, never to a plug-in's other servers (a search engine, say).
ROUTER_AUTH: ContextVar[tuple[str, str] | None] = ContextVar("slime_async_router_auth", default=None)


class HTTPError(RuntimeError):
    def __init__(self, url: str, status: int | None, message: str):
        self.url = url
        self.status = status
        super().__init__(f"{url}: {'HTTP ' + str(status) if status is not None else 'connection failed'}: {message}")


async def post(url: str, payload: Any = None, max_retries: int = 60, headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON; the decoded JSON answer (or its text when it is not JSON)."""
    return await _call("POST", url, payload or {}, max_retries, headers)


async def get(url: str, max_retries: int = 1, headers: dict[str, str] | None = None) -> Any:
    return await _call("GET", url, None, max_retries, headers)


async def _call(method: str, url: str, payload: Any, max_retries: int, headers: dict[str, str] | None) -> Any:
    attempts = max(1, max_retries)
    for attempt in range(1, attempts + 1):
        try:
            return await _once(method, url, payload, headers)
        except HTTPError as error:
            retriable = error.status is None or error.status >= 500
            if not retriable or attempt == attempts:
                raise
            log.info("%s (attempt %d/%d), retrying", error, attempt, attempts)
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


async def _once(method: str, url: str, payload: Any, headers: dict[str, str] | None) -> Any:
    data = None if payload is None else orjson.dumps(payload)
    request_headers = {"Content-Type": "application/json", **_router_auth(url), **(headers or {})}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            async with session.request(method, url, data=data, headers=request_headers) as response:
                body = await response.read()
                status = response.status
    except aiohttp.ClientConnectionError as error:
        raise HTTPError(url, None, str(error) or type(error).__name__) from error
    if status >= 400:
        raise HTTPError(url, status, body.decode(errors="replace")[:2000])
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")


def _router_auth(url: str) -> dict[str, str]:
    auth = ROUTER_AUTH.get()
    return {"Authorization": auth[1]} if auth is not None and url.startswith(auth[0]) else {}
