"""The router's HTTP front: SGLang's ``/generate`` and OpenAI's API in front of the router actor.

Routes only. Request and response shapes live in native_protocol.py and openai_protocol.py
(the Responses API's route in responses_front.py),
tool calls in tool_calls.py, the generation loop (text stops, chunks, resume after a
weight-sync abort) in completion.py, the per-session record in recorder.py. Every engine
request goes through ``router.ask("generate", ...)``, so routing, affinity, failover and the
pause/abort around weight syncs are the router's, exactly as for the rollout's own requests.

A session comes from the path (``/sessions/<id>/v1/...``, ``/sessions/<id>/generate``) or the
``X-Session-Id`` header: its requests go to one engine (prefix cache) and are recorded for
trajectory capture. A request without one gets a private session for its own chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp import web

from actors.router.anthropic_front import MessagesEndpoint
from actors.router.anthropic_protocol import error_body as anthropic_error_body, is_messages_path
from actors.router.completion import Completion, CompletionFailed, CompletionSpec, TextStream, complete, completion_text
from actors.router.config import RouterConfig
from actors.router.errors import RouterError
from actors.router.front_gate import FrontGate, sse_response, waiting
from actors.router.front_stats import FrontStats
from actors.router.http_json import json_response, read_json
from actors.router.native_protocol import NativeError, NativeItem, generate_response, parse_generate
from actors.router.openai_protocol import (
    ChoiceOut, OpenAIError, Sampling, chat_chunk, chat_response, completions_chunk, completions_response,
    error_body, finish_reason, models_response, new_id, parse_chat, parse_completions, usage_chunk,
)
from actors.router.recorder import SessionRecorder
from actors.router.responses_front import ResponsesEndpoint
from actors.router.text_model import TextModel
from actors.router.tokenizer_thread import TokenizerThread
from actors.router.tool_calls import forced_opening, parse_tool_calls
from slime_async.actor import ActorRef, ActorStopped
from slime_async.engine_client import EngineError, EngineHTTPError, EngineTimeout
from slime_async.incremental_text import IncrementalText
from slime_async.trajectory import RecordedChoice
from slime_async.task_group import gather_or_cancel

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"
OPEN_PATHS = ("/health",)  # answered without the API key


@dataclass
class _Session:
    id: str
    recorded: bool  # a client-named session (recorded); else private to one request


class HttpFront:
    def __init__(self, config: RouterConfig, model: TextModel):
        self.config = config
        self.model = replace(model, name=config.router_served_model_name) if config.router_served_model_name else model
        self.recorder = SessionRecorder(config.router_max_recorded_sessions, config.router_max_recorded_turns)
        self.responses = ResponsesEndpoint(self, config.router_max_stored_responses)  # OpenAI's Responses API
        self.url: str | None = None
        self._router: ActorRef | None = None
        self._runner: web.AppRunner | None = None
        self._counters: Counter[str] = Counter()
        self._created = int(time.time())
        self.stats = FrontStats()  # loop lag and the latency the front adds (GET /front_stats)
        self.gate = FrontGate(config.router_front_concurrency)  # requests at work at once: bounds the loop's lag
        self.tokenizer = TokenizerThread()  # template rendering and encoding, off the event loop

    # ----- lifecycle ---------------------------------------------------------------------------
    async def start(self, router: ActorRef) -> str:
        self._router = router
        messages = MessagesEndpoint(self)  # Anthropic's Messages API
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._middleware])
        app.router.add_get("/health", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/front_stats", self._front_stats)
        for prefix in ("", "/sessions/{session_id}"):
            app.router.add_post(prefix + "/generate", self._generate)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
            app.router.add_post(prefix + "/v1/responses", self.responses.create)
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/messages", messages.messages)
            app.router.add_post(prefix + "/v1/messages/count_tokens", messages.count_tokens)
        # handler_cancellation: a client that hangs up stops its completion at the next chunk.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        host, port = self.config.router_host, self.config.router_port
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as error:
            await self._runner.cleanup()
            raise RuntimeError(f"router: cannot serve HTTP on {host}:{port} (--router-host/--router-port): "
                               f"{error}") from error
        bound = self._runner.addresses[0][1]
        self.stats.probe.start()
        self.stats.gc.start()
        self.url = f"http://{host}:{bound}"
        log.info("router: HTTP front on %s (OpenAI API at %s/v1)", self.url, self.url)
        return self.url

    async def stop(self) -> None:
        await self.stats.probe.stop()
        self.stats.gc.stop()
        self.tokenizer.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def metrics(self) -> dict[str, float]:
        return {"router/http_requests": float(self._counters["requests"]),
                "router/http_errors": float(self._counters["errors"]),
                "router/recorded_sessions": float(len(self.recorder)),
                "router/recorded_sessions_evicted": float(self.recorder.evictions),
                "router/stored_responses": float(len(self.responses.store))} | self.stats.metrics()

    # ----- middleware: API key, errors in each API's own format ---------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        reply = _error_for(request.path)
        self._counters["requests"] += 1
        key = self.config.router_api_key
        # Compared as bytes: compare_digest refuses non-ASCII str, which would answer 500, not 401.
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        given_key = request.headers.get("x-api-key", "").encode("utf-8", "surrogateescape")  # Anthropic's header
        if (key and request.path not in OPEN_PATHS and not secrets.compare_digest(given, f"Bearer {key}".encode())
                and not secrets.compare_digest(given_key, key.encode())):
            self._counters["errors"] += 1
            return reply(401, "invalid or missing API key (Authorization: Bearer ... or x-api-key)",
                         "authentication_error", code="invalid_api_key")
        try:
            if request.method == "POST":  # the requests that work: discovery and /front_stats never queue
                return await self.stats.timed_request(lambda: self.gate.run(lambda: handler(request)))
            return await self.stats.timed_request(lambda: handler(request))
        except web.HTTPException as error:
            if error.status < 400:
                raise
            self._counters["errors"] += 1
            return reply(error.status, f"{error.reason}: {request.method} {request.path}",
                         "not_found_error" if error.status == 404 else "invalid_request_error")
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - every failure is answered, in the API's format
            self._counters["errors"] += 1
            status, kind, param = _classify(error)
            if status >= 500:
                log.warning("router: %s %s failed: %s", request.method, request.path, error)
            return reply(status, str(error), kind, param=param)

    # ----- discovery ---------------------------------------------------------------------------
    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _model_info(self, _request: web.Request) -> web.Response:
        return json_response({"model_path": self.model.name, "tokenizer_path": self.model.name, "is_generation": True})

    async def _front_stats(self, _request: web.Request) -> web.Response:
        return json_response(self.stats.snapshot())

    async def _models(self, _request: web.Request) -> web.Response:
        return json_response(models_response(self.model.name, self._created))

    # ----- SGLang /generate ---------------------------------------------------------------------
    async def _generate(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        body = await read_json(request, NativeError)
        text = body.get("text") if isinstance(body, dict) and body.get("input_ids") is None else None
        prompts: dict[str, tuple[list[int], Any]] = {}  # text -> (ids, text parent) of a recorded session

        def encode(prompt_text: str) -> list[int]:
            prompts[prompt_text] = self._prompt_ids(session, prompt_text, self.model.encode_prompt)
            return prompts[prompt_text][0]

        items, is_batch, stream = parse_generate(body, encode, self.model.vocab_size)
        chunk = self.config.router_chunk_tokens
        for item in items:
            if item.spec.stop or stream:
                item.spec.chunk_tokens = chunk
        texts = (text if isinstance(text, list) else [text]) if text is not None else None
        try:
            if stream:
                return await self._stream_generate(request, session, items[0], texts, prompts)
            completions = await self._complete_all(session, [item.spec for item in items])
        finally:
            self._end(session)
        self._record_items(session, items, completions, texts, prompts)
        outputs = [generate_response(item, c, self._text(c, item.spec)) for item, c in zip(items, completions)]
        return json_response(outputs if is_batch else outputs[0])

    async def _stream_generate(self, request: web.Request, session: _Session, item: NativeItem,
                               texts: list[str] | None, prompts: dict[str, tuple[list[int], Any]]
                               ) -> web.StreamResponse:
        response = await _sse(request)
        completion = None
        try:
            async with contextlib.aclosing(self._events(session, [item.spec])) as events:
                async for _, completion, final in events:
                    text = self._text(completion, item.spec) if final else self._decode(completion, item.spec)
                    await _send(response, generate_response(item, completion, text, final=final))
        except Exception as error:  # noqa: BLE001 - the status is sent already: report in the stream
            status, _, _ = _classify(error)
            await _send(response, {"error": {"message": str(error), "code": status}})
        await response.write(b"data: [DONE]\n\n")
        if completion is not None and completion.finish_reason is not None:
            self._record_items(session, [item], [completion], texts, prompts)
        return response

    # ----- OpenAI /v1/chat/completions ----------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        chat = parse_chat(await read_json(request, OpenAIError))
        forced = self.forced_opening(chat.tool_choice, chat.tools)
        text, prompt, text_parent = await self._chat_prompt(session, chat.messages, chat.tools, chat.template_kwargs,
                                                            "messages", forced)
        specs = self._specs(prompt, chat.sampling, chat.sampling.n, forced)
        request_id = new_id("chatcmpl")
        response: web.StreamResponse | None = None
        try:
            if chat.sampling.stream:
                response, choices = await self._stream_chat(request, session, specs, chat, request_id, prompt)
            else:
                completions = await self._complete_all(session, specs)
                choices = [self._choice(c, spec, chat.parse_tools, chat.sampling.logprobs)
                           for c, spec in zip(completions, specs)]
        finally:
            self._end(session)
        if choices is not None:
            self._record(session, prompt, [c.completion for c in choices], text, text_parent)
        if response is not None:
            return response
        return json_response(chat_response(request_id, self.model.name, prompt, choices, chat.sampling.logprobs))

    async def _stream_chat(self, request: web.Request, session: _Session, specs: list[CompletionSpec], chat: Any,
                           request_id: str, prompt: list[int]
                           ) -> tuple[web.StreamResponse, list[ChoiceOut] | None]:
        response = await _sse(request)
        name, logprobs = self.model.name, chat.sampling.logprobs
        streams = [TextStream(spec.stop) for spec in specs]
        sent = [0] * len(specs)
        first = {"role": "assistant", "content": ""}
        for index in range(len(specs)):
            await _send(response, chat_chunk(request_id, name, index, first) | {"prompt_token_ids": prompt})

        def chunk_of(index: int, completion: Completion, final: bool) -> tuple[dict, ChoiceOut] | None:
            spec = specs[index]
            if chat.parse_tools and not final:
                return None  # a tool call is only known whole: sent with the last chunk
            choice = self._choice(completion, spec, chat.parse_tools, logprobs, final)
            if chat.parse_tools:
                delta: dict[str, Any] = {"content": choice.text} if choice.text else {}
                if choice.tool_calls:
                    delta["tool_calls"] = [call.to_openai(index=k) for k, call in enumerate(choice.tool_calls)]
            else:
                text = choice.text if final else self._decode(completion, spec)
                delta = {"content": streams[index].delta(text, final)}
            tokens = (sent[index], len(completion.output_ids))
            sent[index] = tokens[1]
            finish = finish_reason(choice) if final else None
            return chat_chunk(request_id, name, index, delta, choice=choice, tokens=tokens, logprobs=logprobs,
                              finish=finish), choice

        choices = await self._stream_events(response, session, specs, chunk_of)
        if choices is None:
            return response, None
        if chat.sampling.include_usage:
            await _send(response, usage_chunk(request_id, name, "chat.completion.chunk", prompt, choices))
        await response.write(b"data: [DONE]\n\n")
        return response, choices

    # ----- OpenAI /v1/completions ---------------------------------------------------------------
    async def _completions(self, request: web.Request) -> web.StreamResponse:
        session = self._session(request)
        parsed = parse_completions(await read_json(request, OpenAIError), self.model.vocab_size)
        sampling, n = parsed.sampling, parsed.sampling.n
        prompts, texts, parents = [], [], []
        for prompt in parsed.prompts:
            if isinstance(prompt, str):
                ids, parent = self._prompt_ids(session, prompt, self.model.encode_prompt)
            else:
                ids, parent = list(prompt), None
            prompts.append(ids)
            texts.append(prompt if isinstance(prompt, str) else None)
            parents.append(parent)
        specs = [spec for ids in prompts for spec in self._specs(ids, sampling, n)]
        request_id, name = new_id("cmpl"), self.model.name
        response: web.StreamResponse | None = None
        try:
            if sampling.stream:
                response, completions = await self._stream_completions(request, session, specs, parsed, request_id,
                                                                       prompts)
            else:
                completions = await self._complete_all(session, specs)
        finally:
            self._end(session)
        for p, ids in enumerate(prompts):
            if completions is not None:
                self._record(session, ids, completions[p * n:(p + 1) * n], texts[p], parents[p])
        if response is not None:
            return response
        choices = [self._choice(c, spec, False, sampling.logprobs) for c, spec in zip(completions, specs)]
        if parsed.echo:
            for k, choice in enumerate(choices):
                choice.text = (texts[k // n] or self.model.decode(prompts[k // n])) + choice.text
        return json_response(completions_response(request_id, name, prompts, choices, n, sampling.logprobs))

    async def _stream_completions(self, request: web.Request, session: _Session, specs: list[CompletionSpec],
                                  parsed: Any, request_id: str, prompts: list[list[int]]
                                  ) -> tuple[web.StreamResponse, list[Completion] | None]:
        response = await _sse(request)
        sampling, name = parsed.sampling, self.model.name
        streams = [TextStream(spec.stop) for spec in specs]
        sent = [0] * len(specs)

        def chunk_of(index: int, completion: Completion, final: bool) -> tuple[dict, ChoiceOut]:
            choice = self._choice(completion, specs[index], False, sampling.logprobs, final)
            text = choice.text if final else self._decode(completion, specs[index])
            tokens = (sent[index], len(completion.output_ids))
            sent[index] = tokens[1]
            return completions_chunk(request_id, name, index, streams[index].delta(text, final), choice=choice,
                                     tokens=tokens, logprobs=sampling.logprobs,
                                     finish=finish_reason(choice) if final else None), choice

        choices = await self._stream_events(response, session, specs, chunk_of)
        if choices is None:
            return response, None
        if sampling.include_usage:
            await _send(response, usage_chunk(request_id, name, "text_completion", [t for p in prompts for t in p],
                                              choices))
        await response.write(b"data: [DONE]\n\n")
        return response, [c.completion for c in choices]

    async def _stream_events(self, response: web.StreamResponse, session: _Session, specs: list[CompletionSpec],
                             chunk_of: Callable[[int, Completion, bool], tuple[dict, ChoiceOut] | None]
                             ) -> list[ChoiceOut] | None:
        """Run the completions of a streamed request, sending the chunk ``chunk_of`` makes of each
        event (None: nothing to send yet); the final choices in order. A failure is sent as the
        stream's last chunk, in the API's error format, then ``[DONE]``: None."""
        done: dict[int, ChoiceOut] = {}
        try:
            async with contextlib.aclosing(self._events(session, specs)) as events:
                async for index, completion, final in events:
                    made = chunk_of(index, completion, final)
                    if made is None:
                        continue
                    await _send(response, made[0])
                    if final:
                        done[index] = made[1]
        except Exception as error:  # noqa: BLE001 - the client gets it in the stream
            await _send(response, self._stream_error(error))
            await response.write(b"data: [DONE]\n\n")
            return None
        return [done[i] for i in range(len(specs))]

    # ----- generation -------------------------------------------------------------------------
    def _specs(self, prompt: list[int], sampling: Sampling, n: int, forced: str = "") -> list[CompletionSpec]:
        """``forced``: the tool-call opening that ends ``prompt`` (see `forced_opening`)."""
        chunk = self.config.router_chunk_tokens if sampling.stop or sampling.stream else None
        return [CompletionSpec(prompt, dict(sampling.params), sampling.max_tokens, sampling.stop, sampling.no_stop_trim,
                               sampling.skip_special_tokens, chunk, sampling.top_logprobs if sampling.logprobs else 0,
                               forced) for _ in range(n)]

    def forced_opening(self, tool_choice: Any, tools: list[dict[str, Any]] | None) -> str:
        """The tool-call opening a required or named ``tool_choice`` (the chat path's form) appends
        to the rendered prompt, in the model's tool-call format; "" when nothing is forced. The
        model continues the call; those tokens are prompt, so never trained (tool_calls.py)."""
        try:
            return forced_opening(tool_choice, tools, self.model.tool_parser)
        except ValueError as error:
            raise OpenAIError(str(error), param="tool_choice") from None

    async def _complete(self, session: _Session, spec: CompletionSpec, on_progress: Any = None) -> Completion:
        router = self._router
        if session.recorded and self.model.routed_layout is not None:  # R3: the trajectory's experts
            spec = replace(spec, routed=self.model.routed_layout)

        async def send(input_ids: list[int], params: dict[str, Any], **extra: Any) -> dict:
            # No timeout: a request waits in the router while weights sync; the router bounds
            # each engine call itself. ``extra``: logprob_start_len, return_routed_experts. The
            # request's front slot is free meanwhile.
            async with waiting():
                return await self.stats.engine_call(
                    router.ask("generate", input_ids, params, session_id=session.id,
                               top_logprobs_num=spec.top_logprobs_num, timeout=None, **extra))

        decode = lambda ids: self.model.decode(ids, spec.skip_special_tokens)  # noqa: E731
        return await complete(send, spec, decode, self.model.context_len, on_progress)

    async def _complete_all(self, session: _Session, specs: list[CompletionSpec]) -> list[Completion]:
        """The completions of one request; when one fails the others are cancelled (a bare
        gather would leave them generating for an answer nobody reads)."""
        return await gather_or_cancel(*(self._complete(session, spec) for spec in specs))

    async def _events(self, session: _Session, specs: list[CompletionSpec]
                      ) -> AsyncIterator[tuple[int, Completion, bool]]:
        """Progress of several completions as ``(index, completion, final)``, in arrival order.
        ``final`` is read from the completion itself: an event queued before the completion
        finished may be handled after, and must not send text a stop string has since cut."""
        queue: asyncio.Queue = asyncio.Queue()

        async def run(index: int, spec: CompletionSpec) -> None:
            try:
                await self._complete(session, spec, lambda c, _final: queue.put_nowait((index, c, None)))
            except Exception as error:  # noqa: BLE001 - handed to the consumer
                queue.put_nowait((index, None, error))

        tasks = [asyncio.create_task(run(i, spec)) for i, spec in enumerate(specs)]  # cancelled below
        finished: set[int] = set()
        try:
            while len(finished) < len(specs):
                index, completion, error = await queue.get()
                if error is not None:
                    raise error
                if index in finished:
                    continue
                final = completion.finish_reason is not None
                if final:
                    finished.add(index)
                yield index, completion, final
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _choice(self, completion: Completion, spec: CompletionSpec, parse_tools: bool, logprobs: bool,
                final: bool = True) -> ChoiceOut:
        """The answer's choice; while streaming (not ``final``) only its tokens, the text is the stream's."""
        token_texts = [self.model.token_text(t) for t in completion.output_ids] if logprobs else []
        tops = self.top_texts(completion) if logprobs and spec.top_logprobs_num else []
        if not final:
            return ChoiceOut(completion, "", [], token_texts, tops)
        text = self._text(completion, spec)
        calls: list = []
        if parse_tools:
            content, calls = parse_tool_calls(spec.answer_prefix + text, self.model.tool_parser)
            text = content or ""
        return ChoiceOut(completion, text, calls, token_texts, tops)

    def top_texts(self, completion: Completion, start: int = 0, end: int | None = None
                  ) -> list[list[tuple[str, float]]]:
        """Each token's alternatives as (text, logprob), most likely first."""
        return [[(self.model.token_text(t), logprob) for logprob, t in top]
                for top in completion.top_logprobs[start:end]]

    def _text(self, completion: Completion, spec: CompletionSpec) -> str:
        return completion_text(completion, lambda ids: self.model.decode(ids, spec.skip_special_tokens),
                               spec.no_stop_trim)

    def _decode(self, completion: Completion, spec: CompletionSpec) -> str:
        """The text so far of a completion being streamed: only the tokens since the last call are
        decoded (the completion keeps its IncrementalText)."""
        if completion.text is None:
            completion.text = IncrementalText(lambda ids: self.model.decode(ids, spec.skip_special_tokens))
        return completion.text.advance(completion.output_ids)

    # ----- sessions and recording ------------------------------------------------------------------
    def _session(self, request: web.Request) -> _Session:
        named = request.match_info.get("session_id") or request.headers.get(SESSION_HEADER)
        if named:
            return _Session(named, recorded=self.recorder.enabled)
        return _Session(f"http-{uuid.uuid4().hex}", recorded=False)

    def _end(self, session: _Session) -> None:
        """A private session has no later turns: its affinity entry is dropped at once."""
        if not session.recorded and session.id.startswith("http-") and self._router is not None:
            try:
                self._router.tell("end_session", session.id)
            except ActorStopped:
                pass

    def _prompt_ids(self, session: _Session, text: str, encode: Callable[[str], list[int]]
                    ) -> tuple[list[int], Any]:
        """Token ids for a text prompt: in a recorded session the longest recorded prompt +
        completion it starts with keeps its exact ids, and only the rest is tokenized."""
        known, rest, tokenize, parent = self._split_prompt(session, text, encode)
        return known + tokenize(rest), parent

    def _split_prompt(self, session: _Session, text: str, encode: Callable[[str], list[int]]
                      ) -> tuple[list[int], str, Callable[[str], list[int]], Any]:
        """(ids already recorded for the start of ``text``, the rest, how to tokenize it, text parent)."""
        hit = self.recorder.text_prefix(session.id, text) if session.recorded else None
        if hit is None:
            return [], text, encode, None
        parent, chars, ids = hit
        return ids, text[chars:], self.model.encode, (parent, chars)

    async def _chat_prompt(self, session: _Session, messages: list[dict[str, Any]], tools: Any,
                           template_kwargs: dict[str, Any] | None, param: str, forced: str = ""
                           ) -> tuple[str, list[int], Any]:
        """(text, ids, text parent) of a chat prompt ending with ``forced`` (a tool call's opening,
        see `forced_opening`): the template renders and the tokenizer encodes in the tokenizer
        thread, the recorded-prefix lookup runs here (the recorder is the loop's)."""
        try:
            text = await self.tokenizer.run(self.model.render_chat, messages, tools, template_kwargs) + forced
        except Exception as error:  # noqa: BLE001 - jinja raises many types for a message it cannot take
            raise OpenAIError(f"the chat template could not render these {param}: {error}", param=param) from None
        known, rest, tokenize, parent = self._split_prompt(session, text, self.model.encode)
        return text, known + await self.tokenizer.run(tokenize, rest), parent

    def _record(self, session: _Session, prompt: list[int], completions: list[Completion], text: str | None,
                text_parent: Any) -> None:
        if not session.recorded:
            return
        choices = [RecordedChoice(c.output_ids, c.logprobs, c.weight_versions, c.finish_type,  # the recorder copies
                                  c.routed_experts) for c in completions]
        choice_texts = [self.model.decode(c.output_ids, skip_special_tokens=False) for c in completions]
        self.recorder.record(session.id, prompt, choices, text=text, choice_texts=choice_texts if text else None,
                             text_parent=text_parent)

    def _record_items(self, session: _Session, items: list[NativeItem], completions: list[Completion],
                      texts: list[str] | None, prompts: dict[str, tuple[list[int], Any]]) -> None:
        """One turn per prompt of a /generate call (its n samples are the choices)."""
        by_spec: dict[int, list[int]] = {}
        for k, item in enumerate(items):
            by_spec.setdefault(id(item.spec), []).append(k)
        for p, indices in enumerate(by_spec.values()):
            spec = items[indices[0]].spec
            text = texts[p] if texts is not None else None
            parent = prompts.get(text, (None, None))[1] if text is not None else None
            self._record(session, spec.prompt_ids, [completions[k] for k in indices], text, parent)

    def _stream_error(self, error: BaseException) -> dict[str, Any]:
        status, kind, param = _classify(error)
        return error_body(str(error), kind, param) | {"status": status}


# ----- helpers ----------------------------------------------------------------------------------------


def _classify(error: BaseException) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, param) for a failure."""
    if isinstance(error, OpenAIError):
        return error.status, error.type, error.param
    if isinstance(error, EngineHTTPError) and error.status is not None and 400 <= error.status < 500:
        return 400, "invalid_request_error", None  # the engine refused the request as given
    if isinstance(error, EngineTimeout):
        return 504, "server_error", None
    if isinstance(error, (EngineError, CompletionFailed)):
        return 502, "server_error", None
    if isinstance(error, (RouterError, ActorStopped)):
        return 503, "server_error", None
    if isinstance(error, ValueError):  # NativeError, a tokenizer or template that refused the input
        return 400, "invalid_request_error", None
    return 500, "server_error", None


def _error(openai: bool, status: int, message: str, kind: str, param: str | None = None,
           code: str | None = None) -> web.Response:
    body = error_body(message, kind, param, code) if openai else {"error": {"message": message}}
    return json_response(body, status)


def _error_for(path: str) -> Callable[..., web.Response]:
    """``_error`` in the format of the API ``path`` belongs to: Anthropic's, OpenAI's or SGLang's."""
    if is_messages_path(path):
        return lambda status, message, *_, **__: json_response(anthropic_error_body(status, message), status)
    openai = "/v1/" in path
    return lambda *args, **kwargs: _error(openai, *args, **kwargs)


async def _sse(request: web.Request) -> web.StreamResponse:
    response = sse_response()
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, payload: Any) -> None:
    await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")
