"""What a streamed /generate of the CPU engine needs beside its route (server.py ``_generate_stream``):
the tokens handed over from the scheduler thread, and SGLang's server-sent-event framing."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from actors.engine.cpu.scheduler import Request


def sse_event(chunk: dict[str, Any]) -> bytes:
    """One chunk as SGLang's http_server ``generate_request`` frames it (``data: [DONE]`` ends a stream)."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class StreamedTokens:
    """What a streamed request has generated so far, on the event loop's side: the scheduler
    thread hands each token over with ``call_soon_threadsafe(add)``, in order."""

    def __init__(self) -> None:
        self.req: Request | None = None
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[float, int]]] = []  # per token when the request asked for them
        self.version: str | None = None  # the engine's version when the latest token arrived
        self.changed = asyncio.Event()

    def add(self, req: Request, token: int, logprob: float, top: list[tuple[float, int]], version: str) -> None:
        self.req = req
        self.ids.append(token)
        self.logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.version = version
        self.changed.set()

    def finish(self, version: str) -> None:
        """The request finished (its answer is the last chunk, built now, under ``version``)."""
        self.version = version
        self.changed.set()

