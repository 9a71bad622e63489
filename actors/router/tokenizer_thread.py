"""The front's tokenizer work off the event loop: chat-template rendering and encoding.

One thread, not a pool: HF fast tokenizers release the GIL while encoding (the Rust side runs
while the loop goes on), and jinja rendering is Python, which the interpreter interleaves with
the loop every switch interval (5 ms); more threads would only make the loop wait longer for the
GIL. A process pool would also free the loop from decoding (which holds the GIL), at the price
of shipping every prompt to another process; decoding is kept small instead (only new tokens,
slime_async/incremental_text.py). Measured by benchmarks/tokenizer_gil.py; docs/agents.md ("The
front under load").
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class TokenizerThread:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="router-tokenizer")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the tokenizer thread; its exception is raised here."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
