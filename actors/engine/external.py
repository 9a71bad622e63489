"""External engines: already-running SGLang-compatible servers given by URL.

The run never starts, restarts or kills them; it only asks what they serve and then
health-checks and routes to them like the engines it owns.
"""

from __future__ import annotations

import aiohttp

from actors.engine.info import EngineInfo
from slime_async.engine_client import EngineClient, EngineError, EngineHTTPError, RetryPolicy

FLAG = "--rollout-external-engine-addrs"


class ExternalEngineError(RuntimeError):
    """An external engine address is down or does not speak SGLang's API."""

    def __init__(self, url: str, reason: str):
        self.url = url
        super().__init__(f"external engine {url} (from {FLAG}): {reason}")


def normalize_engine_url(address: str) -> str:
    """ "host:port" → "http://host:port"; a URL with a scheme is kept (without a trailing /)."""
    address = address.strip().rstrip("/")
    if not address:
        raise ValueError(f"{FLAG} contains an empty address")
    if "://" not in address:
        address = "http://" + address
    return address


async def discover_external_engine(
    url: str,
    session: aiohttp.ClientSession,
    api_key: str | None = None,
    *,
    timeout: float = 10.0,
) -> EngineInfo:
    """Ask a running server what it serves (`/get_model_info`, `/get_server_info`).

    Raises ExternalEngineError naming the address when it cannot be reached, refuses the
    key, or answers in a shape that is not SGLang's.
    """
    url = normalize_engine_url(url)
    # Discovery happens at start-up: a down engine should fail the run at once with its
    # address, not after minutes of backoff. One retry covers a server mid-restart.
    client = EngineClient(
        url,
        session=session,
        api_key=api_key,
        timeout=timeout,
        retry=RetryPolicy(attempts=2, initial_delay=0.5, max_delay=0.5),
    )
    try:
        model_info = await client.get_model_info(timeout=timeout)
        server_info = await client.get_server_info(timeout=timeout)
    except EngineHTTPError as error:
        if error.status in (401, 403):
            raise ExternalEngineError(
                url, f"rejected the API key (HTTP {error.status}; see --engine-api-key)"
            ) from error
        if error.status == 404:
            raise ExternalEngineError(
                url, f"is not an SGLang-compatible server: {error.endpoint} answered 404 ({error.message})"
            ) from error
        raise ExternalEngineError(url, f"answered an error: {error}") from error
    except EngineError as error:
        raise ExternalEngineError(url, f"is not reachable: {error}") from error

    model_path = model_info.get("model_path") or server_info.get("model_path")
    if not model_path:
        raise ExternalEngineError(
            url,
            "is not an SGLang-compatible server: /get_model_info has no model_path "
            f"(keys: {sorted(model_info)[:20]})",
        )
    if model_info.get("is_generation") is False:
        raise ExternalEngineError(url, f"serves {model_path}, which is not a generation model")
    tp_size = server_info.get("tp_size", 1)
    weight_version = model_info.get("weight_version", server_info.get("weight_version"))
    return EngineInfo(
        url=url,
        model_path=str(model_path),
        tp_size=int(tp_size),
        weight_version=None if weight_version is None else str(weight_version),
        owned=False,
    )
