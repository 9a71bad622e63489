"""Running a supervision tree as a program: event loop choice, signals, exit codes."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slime_async.actor import ActorFailed, ActorStopped, spawn
from slime_async.exception_text import child_exception
from slime_async.supervisor import Supervisor

log = logging.getLogger(__name__)

EXIT_FAILURE = 1
# How long a loop that lost an actor waits for the failing tree to say why.
_FAILURE_REPORT_GRACE = 30.0


# The collector's thresholds once start-up is frozen (CPython's default: 700, 10, 10). A young
# collection every 700 allocations promotes whatever lives a few ms (an HTTP request, its token
# lists) to the oldest generation, and at a thousand concurrent agent sessions that triggered a
# full collection every 1-2 s, each walking every in-flight prompt's ids: ~110 ms of CPU, the loop
# stopped (benchmarks/front_load.py: 14 full collections in one run; 1 with these thresholds).
GC_THRESHOLDS = (10_000, 10, 100)


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def run(main: Callable[[], Coroutine[Any, Any, int]], *, use_uvloop: bool | None = None) -> int:
    """Run ``main()`` on uvloop when it is installed (or when asked), else on stock asyncio."""
    if use_uvloop is None:
        use_uvloop = uvloop_available()
    if use_uvloop:
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


async def run_supervised(
    root: Supervisor,
    main: Callable[[Supervisor], Awaitable[int | None]] | None = None,
    *,
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> int:
    """Start ``root``, run ``main(root)`` while it lives, and stop everything in order at the end.

    Returns the exit code: ``main``'s result (0 if None); non-zero when the tree failed (the
    console's last line names the first failure: the child and its error); 128 + signal number
    after SIGINT/SIGTERM, which is acted on at once, during start-up too. Without ``main`` the
    tree runs until a signal arrives or it fails.
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in signals:
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    try:
        starting = asyncio.create_task(spawn(root))
        await asyncio.wait([starting, received], return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            # Start-up can take minutes (engines loading, trainer ranks joining): cancelling it
            # makes each supervisor stop the children it has started so far, in reverse.
            log.warning("received %s during start-up: stopping", received.result().name)
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            return 128 + received.result().value
        if starting.exception() is not None:  # a child failed to start
            report_error(f"{root.name} failed to start: {starting.exception()}",
                         exception=child_exception(starting.exception()))
            return EXIT_FAILURE
        ref = starting.result()
        freeze_startup_objects()
        tree = asyncio.create_task(ref.wait())
        work = asyncio.create_task(main(root)) if main is not None else loop.create_future()
        await asyncio.wait([tree, work, received], return_when=asyncio.FIRST_COMPLETED)
        if work.done() and not tree.done() and isinstance(work.exception(), ActorStopped):
            # The loop lost an actor because the tree is failing: wait for the tree's reason
            # (the child that failed first) instead of reporting the symptom.
            await asyncio.wait([tree, received], timeout=_FAILURE_REPORT_GRACE, return_when=asyncio.FIRST_COMPLETED)
        if tree.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            error = tree.exception()
            if isinstance(error, ActorFailed):
                report_error(str(error.error), exception=child_exception(error.error))
                return EXIT_FAILURE
            return 0
        if received.done():
            log.warning("received %s: stopping", received.result().name)
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            await ref.stop()
            return 128 + received.result().value
        await ref.stop()
        tree.cancel()
        if work.exception() is not None:
            error = work.exception()
            report_error(f"{type(error).__name__}: {error}", exception=child_exception(error))
            return EXIT_FAILURE
        return int(work.result() or 0)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def freeze_startup_objects() -> None:
    """Move every object alive now to the collector's permanent generation.

    What start-up made (torch, transformers and their modules, tokenizers, configs: ~350,000
    objects in the router) lives as long as the process, yet every full collection walks all of
    it again, and a full collection stops the event loop: 80-430 ms each on the 2-core machine,
    21 of them in one front load run, its p99 loop lag (benchmarks/front_load.py,
    docs/agents.md "The front under load"). Frozen, a full collection walks only what the run
    made since. Start-up garbage is collected first, so that no cycle becomes immortal. Then the
    collector runs less often (`GC_THRESHOLDS`).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def report_error(message: str, file=None, exception: str = "") -> None:
    """Print ``error: message``; a message of several lines (a log tail) ends with its first line
    again, so the console's last lines say what failed: that line, then the failed child's own
    ``exception`` (a section ending ``message``, see ``exception_text.child_exception``)."""
    file = file or sys.stderr
    message = message.strip()
    if exception and message.endswith(exception):
        message = message[:-len(exception)].rstrip()
    else:
        exception = ""
    print(f"error: {message}", file=file)
    first = message.splitlines()[0] if message else ""
    if exception:
        print(f"error: {first}", file=file)
        print(exception, file=file)
    elif "\n" in message:  # a log tail or an op error carrying a traceback: name what was raised
        print(f"error: {first}{_raised(message.splitlines())}", file=file)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def _raised(lines: list[str]) -> str:
    """`` ValueError: ... (at path/file.py:145)`` for the last traceback in ``lines``, else ''."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return ""
    frames, exception = [], ""
    for line in lines[starts[-1] + 1:]:
        frame = _FRAME.match(line)
        if frame:
            frames.append(frame)
        elif line and not line[0].isspace():
            exception = line.strip()
            break
    if not exception:
        return ""
    where = f" (at {frames[-1].group(1)}:{frames[-1].group(2)})" if frames else ""
    return f" {exception}{where}"
