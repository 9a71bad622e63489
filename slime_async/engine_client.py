"""Async HTTP client for one inference engine that speaks SGLang's native API.

Every engine the runtime talks to (an SGLang server it launched, an external SGLang URL, the
embedded CPU engine) is reached through this one class, so retries, timeouts, auth and error
messages behave the same whatever serves the tokens.

Retry policy (why it differs per endpoint):
- Reads and idempotent control calls (health, info, loads, pause/continue, abort, flush,
  update-from-disk, destroy group, weight version) are retried with exponential backoff on
  connection errors and on 5xx answers: repeating them leaves the engine in the same state.
- `generate`, `init_weights_update_group` and `update_weights_from_distributed` are
  retried ONLY when the connection could not be opened
  (refused, unreachable): then the request provably never reached the server. Once it was
  sent, a retry would either duplicate work the server already did (a second sample with
  its own RNG draw, counted twice in load) or, for the collective weight calls, desynchronise
  the broadcast with the trainer, which is already waiting on the other side.
- 4xx is never retried (the request itself is wrong), and neither is a timeout (the
  per-call timeout is the caller's whole budget; silently doubling it would hide a stuck
  engine from the router's health logic).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import aiohttp
import orjson

from slime_async.generate_output import SSEDecoder, StreamAssembler, stream_failure

log = logging.getLogger(__name__)

# SGLang's /pause_generation modes (slime_async/quiesce.py maps the runtime's quiesce modes onto them).
EnginePauseMode = Literal["abort", "retract", "in_place"]


# --------------------------------------------------------------------------------------
# Errors


class EngineError(RuntimeError):
    """A call to an engine failed. `str()` names the engine, the endpoint and the reason."""

    def __init__(self, url: str, endpoint: str, status: int | None, message: str):
        self.url = url
        self.endpoint = endpoint
        self.status = status
        self.message = message
        super().__init__(self._describe())

    def _describe(self) -> str:
        status = f"HTTP {self.status}" if self.status is not None else self.kind
        return f"engine {self.url} {self.endpoint}: {status}: {self.message}"

    kind = "error"

    def __reduce__(self):  # keep the exception picklable (it may cross an actor boundary)
        return (type(self), (self.url, self.endpoint, self.status, self.message))


class EngineConnectionError(EngineError):
    """The engine could not be reached, or dropped the connection."""

    kind = "connection failed"


class EngineUnreachable(EngineConnectionError):
    """The connection could not be opened (refused, no route): the request was never sent."""


class EngineHTTPError(EngineError):
    """The engine answered with an error status (4xx/5xx), or with `success: false`."""

    kind = "rejected"


class EngineTimeout(EngineError):
    """No complete answer within the call's timeout."""

    kind = "timed out"


# --------------------------------------------------------------------------------------
# Client


class _Retry(Enum):
    IDEMPOTENT = "idempotent"  # retry on connection errors and 5xx
    BEFORE_SEND = "before_send"  # retry only when the connection could not be opened


@dataclass
class RetryPolicy:
    """Exponential backoff with jitter: delay_i = min(max_delay, initial * 2**i) * U(0.5, 1)."""

    attempts: int = 4  # total tries, including the first
    initial_delay: float = 0.1
    max_delay: float = 2.0

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.initial_delay * 2**attempt) * random.uniform(0.5, 1.0)


def new_engine_session() -> aiohttp.ClientSession:
    """An HTTP session for talking to engines (one per client, or one shared by the router).

    No pool limit: the engines' schedulers bound concurrency, a pool limit would queue requests
    invisibly. Keep-alive 3 s: SGLang's uvicorn drops idle connections after 5 s, and reusing one
    it just closed fails the request with ServerDisconnectedError (aiohttp keeps them 15 s).
    """
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0))


class EngineClient:
    """Typed calls for one engine base URL (e.g. "http://127.0.0.1:30000").

    Pass `session` to share one connection pool between many clients (the router holds one
    per process); otherwise the client creates its own on first use and `close()` closes it.
    `timeout` (seconds, None = no limit) applies to every call whose own `timeout` is None;
    health probes and info calls default to short timeouts of their own.
    """

    def __init__(
        self,
        url: str,
        *,
        session: aiohttp.ClientSession | None = None,
        api_key: str | None = None,
        timeout: float | None = 600.0,
        retry: RetryPolicy | None = None,
    ):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self._session = session
        self._owns_session = session is None
        self._old_endpoints: set[str] = set()  # renamed endpoints this engine only knows by the old name

    # ---- lifecycle

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session if this client created it; a shared session is left open."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily so that constructing a client needs no running event loop.
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise RuntimeError(f"the shared aiohttp session of engine client {self.url} is closed")
            self._session = new_engine_session()
        return self._session

    # ---- generation

    async def generate(
        self,
        input_ids: list[int],
        sampling_params: dict[str, Any],
        *,
        return_logprob: bool = True,
        rid: str | None = None,
        timeout: float | None = None,
        stream: bool = False, version_lag: int = 0, top_logprobs_num: int = 0, logprob_start_len: int | None = None,
        return_routed_experts: bool = False) -> dict[str, Any]:
        """`POST /generate` for one prompt; returns SGLang's answer dict (see `parse_generate_output`);
        ``top_logprobs_num``: each token's likeliest alternatives too (``output_top_logprobs``).
        ``stream``: assemble SGLang's stream of chunks (server-sent events) into the same answer, each
        output token's weight version that of the chunk that first reported it (``weight_version_segments``
        unless the engine gives its own; `StreamAssembler`, also for ``version_lag``). An abort ends the
        stream like the plain call's answer; a failure in it raises the EngineError the plain call would
        (EngineHTTPError with its status, EngineConnectionError when it breaks off, EngineTimeout past
        ``timeout``). ``logprob_start_len``: SGLang's prompt logprobs from that input position on.
        ``return_routed_experts``: MoE, ``meta_info.routed_experts`` (slime_async/routed_experts.py)."""
        payload = _generate_payload(input_ids, sampling_params, return_logprob, rid, logprob_start_len,
                                    return_routed_experts, top_logprobs_num)
        if not stream:
            return await self._call("POST", "/generate", payload, timeout=timeout, retry=_Retry.BEFORE_SEND)
        payload["stream"] = True
        return await self._retrying(lambda: self._stream_once("/generate", payload, timeout, version_lag),
                                    _Retry.BEFORE_SEND)

    async def generate_batch(
        self,
        input_ids: list[list[int]],
        sampling_params: dict[str, Any] | list[dict[str, Any]],
        *,
        return_logprob: bool = True,
        rids: list[str] | None = None,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """`POST /generate` with a list of prompts (SGLang's batch form); one answer per prompt."""
        if rids is not None and len(rids) != len(input_ids):
            raise ValueError(f"generate_batch got {len(rids)} rids for {len(input_ids)} prompts")
        payload = _generate_payload(input_ids, sampling_params, return_logprob, rids)
        result = await self._call("POST", "/generate", payload, timeout=timeout, retry=_Retry.BEFORE_SEND)
        if not isinstance(result, list) or len(result) != len(input_ids):
            got = f"a list of {len(result)}" if isinstance(result, list) else type(result).__name__
            raise EngineHTTPError(self.url, "/generate", 200, f"batch of {len(input_ids)} prompts answered with {got}")
        return result

    # ---- health and discovery

    async def health(self, *, timeout: float | None = 10.0) -> bool:
        """`GET /health`: True when the server answers 200; False when it is unreachable or not ready."""
        return await self._probe("/health", timeout)

    async def health_generate(self, *, timeout: float | None = 30.0) -> bool:
        """`GET /health_generate`: True when the server can generate a token."""
        return await self._probe("/health_generate", timeout)

    async def get_model_info(self, *, timeout: float | None = 30.0) -> dict[str, Any]:
        """Model path, weight version, ...: `/model_info`, or `/get_model_info` on older SGLang."""
        return await self._call_renamed("/model_info", "/get_model_info", timeout)

    async def get_server_info(self, *, timeout: float | None = 30.0) -> dict[str, Any]:
        """ServerArgs plus scheduler info: `/server_info`, or `/get_server_info` on older SGLang."""
        return await self._call_renamed("/server_info", "/get_server_info", timeout)

    async def get_loads(self, *, timeout: float | None = 10.0) -> dict[str, Any]:
        """`GET /v1/loads`: per-DP-rank load as the engine reports it (the router sums it: `reported_load`)."""
        return await self._call_json("GET", "/v1/loads", timeout=timeout)

    async def get_weight_version(self, *, timeout: float | None = 30.0) -> str | None:
        """The weight version the engine serves, from `/get_model_info` (SGLang 0.5.17 answers
        404 on the older `/get_weight_version`; `/get_model_info` carries it in every version)."""
        version = (await self.get_model_info(timeout=timeout)).get("weight_version")
        return None if version is None else str(version)

    # ---- scheduling control

    async def pause_generation(self, mode: EnginePauseMode = "abort", *, timeout: float | None = None) -> Any:
        """Stop scheduling: "abort" returns in-flight requests (finish_reason abort), "retract"
        puts them back in the queue, "in_place" freezes them with their KV cache."""
        if mode not in ("abort", "retract", "in_place"):
            raise ValueError(f"pause mode must be 'abort', 'retract' or 'in_place', got {mode!r}")
        return await self._call("POST", "/pause_generation", {"mode": mode}, timeout=timeout)

    async def continue_generation(self, *, timeout: float | None = None) -> Any:
        return await self._call("POST", "/continue_generation", {}, timeout=timeout)

    async def abort_request(self, rid: str | None = None, abort_all: bool = False, *, timeout: float | None = None) -> Any:
        """Abort one request by rid, or all of them; aborted requests return their tokens so far."""
        if rid is None and not abort_all:
            raise ValueError("abort_request needs a rid or abort_all=True")
        payload: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            payload["rid"] = rid
        return await self._call("POST", "/abort_request", payload, timeout=timeout)

    async def flush_cache(self, *, wait_idle_s: float | None = None, timeout: float | None = None) -> Any:
        """`GET /flush_cache`; raises EngineHTTPError (400) when requests are still running. With
        ``wait_idle_s``, SGLang defers the flush until its scheduler is idle (up to that long) and
        answers then: a barrier for calls that need an idle scheduler."""
        query = f"?timeout={wait_idle_s:g}" if wait_idle_s else ""
        return await self._call("GET", f"/flush_cache{query}", None, timeout=timeout)

    # ---- weight updates

    async def update_weights_from_disk(
        self, model_path: str, weight_version: str | None = None, *, flush_cache: bool = True,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Load an HF checkpoint dir. ``flush_cache`` (SGLang's default, true) needs an idle engine:
        SGLang asserts, and exits, when it flushes with requests still in its batch."""
        payload: dict[str, Any] = {"model_path": model_path, "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return await self._call_update("/update_weights_from_disk", payload, timeout, _Retry.IDEMPOTENT)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str = "weight_update_group",
        backend: str = "nccl",
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Ask the engine to join a broadcast group; it blocks until the trainer joins too,
        so the trainer side must call `init_custom_process_group` concurrently."""
        payload = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return await self._call_update("/init_weights_update_group", payload, timeout, _Retry.BEFORE_SEND)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str = "weight_update_group",
        weight_version: str | None = None,
        flush_cache: bool = True,
        *,
        load_format: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Receive the named tensors by broadcast from the group's rank 0 (the trainer),
        which must broadcast them in this order while this call is pending: one broadcast per
        tensor, or with ``load_format="flattened_bucket"`` one of all their bytes back to back
        (SGLang's FlattenedTensorBucket; slime_async.weights.flat_bucket)."""
        payload: dict[str, Any] = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": flush_cache,
        }
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if load_format is not None:
            payload["load_format"] = load_format
        return await self._call_update("/update_weights_from_distributed", payload, timeout, _Retry.BEFORE_SEND)

    async def destroy_weights_update_group(
        self, group_name: str = "weight_update_group", *, timeout: float | None = None
    ) -> dict[str, Any]:
        return await self._call_update(
            "/destroy_weights_update_group", {"group_name": group_name}, timeout, _Retry.IDEMPOTENT
        )

    # ---- colocated training (SGLang's memory saver; the CPU engine serves the same)

    async def release_memory_occupation(self, tags: list[str] | None = None, *,
                                        timeout: float | None = None) -> Any:
        """Free the engine's memory of ``tags`` ("weights", "kv_cache"; all when None); it must be idle."""
        return await self._call("POST", "/release_memory_occupation", {"tags": tags}, timeout=timeout,
                                retry=_Retry.BEFORE_SEND)

    async def resume_memory_occupation(self, tags: list[str] | None = None, *,
                                       timeout: float | None = None) -> Any:
        """Allocate the memory of ``tags`` again (weights come back undefined until updated)."""
        return await self._call("POST", "/resume_memory_occupation", {"tags": tags}, timeout=timeout,
                                retry=_Retry.BEFORE_SEND)

    async def update_weights_from_tensor(
        self, serialized_named_tensors: list[str], weight_version: str | None = None, flush_cache: bool = True,
        *, load_format: str | None = None, timeout: float | None = None,
    ) -> dict[str, Any]:
        """Load tensors from IPC handles: one base64 payload per engine TP rank (slime_async.weights.tensor_ipc)."""
        payload: dict[str, Any] = {"serialized_named_tensors": serialized_named_tensors, "flush_cache": flush_cache}
        if weight_version is not None:
            payload["weight_version"] = weight_version
        if load_format is not None:
            payload["load_format"] = load_format
        return await self._call_update("/update_weights_from_tensor", payload, timeout, _Retry.BEFORE_SEND)

    # ---- transport

    async def _probe(self, endpoint: str, timeout: float | None) -> bool:
        try:
            await self._call("GET", endpoint, None, timeout=timeout, retry=_Retry.BEFORE_SEND, attempts=1)
        except EngineError:
            return False
        return True

    async def _call_renamed(self, endpoint: str, old_endpoint: str, timeout: float | None) -> dict[str, Any]:
        """GET an endpoint SGLang renamed: 0.5.17 deprecates `/get_*_info` in favour of `/*_info`,
        which older versions lack. The first 404 on the new name switches this client to the old one."""
        if endpoint not in self._old_endpoints:
            try:
                return await self._call_json("GET", endpoint, timeout=timeout)
            except EngineHTTPError as error:
                if error.status != 404:
                    raise
                self._old_endpoints.add(endpoint)
        return await self._call_json("GET", old_endpoint, timeout=timeout)

    async def _call_json(self, method: str, endpoint: str, *, timeout: float | None) -> dict[str, Any]:
        result = await self._call(method, endpoint, None, timeout=timeout)
        if not isinstance(result, dict):
            raise EngineHTTPError(self.url, endpoint, 200, f"expected a JSON object, got {_excerpt(result)}")
        return result

    async def _call_update(
        self, endpoint: str, payload: dict[str, Any], timeout: float | None, retry: _Retry
    ) -> dict[str, Any]:
        result = await self._call("POST", endpoint, payload, timeout=timeout, retry=retry)
        if not isinstance(result, dict):
            result = {"success": True, "message": str(result)}
        # SGLang answers 400 on failure, but some versions and proxies answer 200 with
        # success=false; both must surface as an error, never as a silent no-op update.
        if result.get("success") is False:
            raise EngineHTTPError(self.url, endpoint, 200, str(result.get("message", result)))
        return result

    async def _call(
        self,
        method: str,
        endpoint: str,
        payload: Any,
        *,
        timeout: float | None,
        retry: _Retry = _Retry.IDEMPOTENT,
        attempts: int | None = None,
    ) -> Any:
        """One logical call with retries; returns the decoded JSON body, or the text if not JSON."""
        return await self._retrying(lambda: self._send_once(method, endpoint, payload, timeout), retry, attempts)

    async def _retrying(self, send: Callable[[], Awaitable[Any]], retry: _Retry, attempts: int | None = None) -> Any:
        attempts = attempts or self.retry.attempts
        for attempt in range(attempts):
            try:
                return await send()
            except EngineError as error:
                if attempt + 1 >= attempts or not _retryable(error, retry):
                    raise
                delay = self.retry.delay(attempt)
                log.warning("%s; retrying in %.2f s (attempt %d of %d)", error, delay, attempt + 2, attempts)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _send_once(self, method: str, endpoint: str, payload: Any, timeout: float | None) -> Any:
        session = self._get_session()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        data = None
        if payload is not None:
            data = orjson.dumps(payload)
            headers["Content-Type"] = "application/json"
        total = self.timeout if timeout is None else timeout
        try:
            async with session.request(
                method,
                self.url + endpoint,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=total),
            ) as response:
                body = await response.read()
                status = response.status
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(self.url, endpoint, None, _connect_message(exc)) from exc
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise EngineTimeout(self.url, endpoint, None, f"no answer within {total} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            # Sent (at least partly) but the connection broke: the server may have acted on it.
            raise EngineConnectionError(self.url, endpoint, None, f"{type(exc).__name__}: {exc}") from exc
        if status >= 400:
            raise EngineHTTPError(self.url, endpoint, status, _error_message(body))
        return _decode(body)


    async def _stream_once(self, endpoint: str, payload: Any, timeout: float | None, version_lag: int) -> dict[str, Any]:
        """One streamed call: its chunks assembled into the plain call's answer."""
        session = self._get_session()
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        total = self.timeout if timeout is None else timeout
        assembler, decoder, done = StreamAssembler(version_lag), SSEDecoder(), False
        try:
            async with session.request("POST", self.url + endpoint, data=orjson.dumps(payload), headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=total)) as response:
                if response.status >= 400:
                    raise EngineHTTPError(self.url, endpoint, response.status, _error_message(await response.read()))
                if not response.content_type.startswith("text/event-stream"):
                    answer = _decode(await response.read())  # an engine that does not stream: its plain answer
                    if not isinstance(answer, dict):
                        raise EngineHTTPError(self.url, endpoint, response.status,
                                              f"expected a stream or a JSON object, got {_excerpt(answer)}")
                    return answer
                async for data in response.content.iter_any():
                    for event in decoder.feed(data):
                        if event.strip() == b"[DONE]":
                            done = True
                            break
                        self._take_chunk(assembler, event, endpoint)
                    if done:
                        break
        except aiohttp.ClientConnectorError as exc:
            raise EngineUnreachable(self.url, endpoint, None, _connect_message(exc)) from exc
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise EngineTimeout(self.url, endpoint, None, f"no complete stream within {total} s "
                                f"({assembler.tokens} tokens received)") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise EngineConnectionError(self.url, endpoint, None, f"stream broke off after {assembler.tokens} "
                                        f"tokens: {type(exc).__name__}: {exc}") from exc
        if not assembler.finished:
            if not done:  # the connection closed cleanly, mid-request: the engine went away
                raise EngineConnectionError(self.url, endpoint, None, f"stream ended after {assembler.tokens} "
                                            "tokens, before the request finished")
            raise EngineHTTPError(self.url, endpoint, 200, f"stream ended with [DONE] after {assembler.tokens} "
                                  "tokens but no chunk had a finish_reason")
        return assembler.answer()

    def _take_chunk(self, assembler: StreamAssembler, event: bytes, endpoint: str) -> None:
        try:
            chunk = orjson.loads(event)
        except orjson.JSONDecodeError as exc:
            raise EngineHTTPError(self.url, endpoint, 200, f"stream chunk is not JSON ({exc}): "
                                  f"{_excerpt(event.decode('utf-8', 'replace'))}") from None
        failure = stream_failure(chunk) if isinstance(chunk, dict) else None
        if failure is not None:
            raise EngineHTTPError(self.url, endpoint, failure[0], failure[1])
        try:
            assembler.add(chunk)
        except ValueError as exc:
            raise EngineHTTPError(self.url, endpoint, 200, f"bad stream chunk: {exc}") from None


# The caller-facing fields of SGLang 0.5.17's SamplingParams. SGLang answers an unknown one
# with HTTP 500 (a TypeError in its tokenizer manager), so a typo is caught here with its name.
SGLANG_SAMPLING_FIELDS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params",
})


def check_sampling_params(sampling_params: dict[str, Any] | list[dict[str, Any]]) -> None:
    """Raise ValueError naming any field that is not one of SGLang's sampling parameters."""
    for params in sampling_params if isinstance(sampling_params, list) else [sampling_params]:
        if not isinstance(params, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(params).__name__}")
        for key in params:
            if key not in SGLANG_SAMPLING_FIELDS:
                close = difflib.get_close_matches(key, SGLANG_SAMPLING_FIELDS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"unknown sampling_params field {key!r}{hint}")


def _generate_payload(input_ids: Any, sampling_params: Any, return_logprob: bool, rid: Any,
                      logprob_start_len: int | None = None, return_routed_experts: bool = False,
                      top_logprobs_num: int = 0) -> dict[str, Any]:
    """The `/generate` body for one prompt or a batch (SGLang takes lists in the same fields)."""
    check_sampling_params(sampling_params)
    payload: dict[str, Any] = {"input_ids": input_ids, "sampling_params": sampling_params,
                               "return_logprob": return_logprob, "rid": rid, "logprob_start_len": logprob_start_len,
                               "return_routed_experts": return_routed_experts or None,
                               "top_logprobs_num": top_logprobs_num or None}
    return {key: value for key, value in payload.items() if value is not None}


def _retryable(error: EngineError, retry: _Retry) -> bool:
    if isinstance(error, EngineUnreachable):
        return True
    if retry is _Retry.BEFORE_SEND:
        return False
    if isinstance(error, EngineConnectionError):
        return True
    return isinstance(error, EngineHTTPError) and error.status is not None and error.status >= 500


def _connect_message(exc: aiohttp.ClientConnectorError) -> str:
    reason = exc.os_error.strerror if exc.os_error is not None and exc.os_error.strerror else str(exc)
    return f"cannot connect: {reason}"


def _decode(body: bytes) -> Any:
    if not body:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")


def _error_message(body: bytes) -> str:
    """The server's own words, from any of the error shapes SGLang and FastAPI produce."""
    decoded = _decode(body)
    if isinstance(decoded, dict):
        error = decoded.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        for key in ("message", "detail", "error"):
            if decoded.get(key):
                return str(decoded[key])
    if decoded is None:
        return "(empty body)"
    return _excerpt(decoded)


def _excerpt(value: Any, limit: int = 500) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."
