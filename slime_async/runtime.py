"""Running a supervision tree as a program: event loop choice, signals, exit codes."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from slime_async.actor import ActorFailed, spawn
from slime_async.supervisor import Supervisor

log = logging.getLogger(__name__)

EXIT_FAILURE = 1


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
    message names the child and its error); 128 + signal number after SIGINT/SIGTERM. Without
    ``main`` the tree runs until a signal arrives or it fails.
    """
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in signals:
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    try:
        try:
            ref = await spawn(root)
        except Exception as error:  # noqa: BLE001 - a child failed to start
            print(f"error: {root.name} failed to start: {error}", file=sys.stderr)
            return EXIT_FAILURE
        tree = asyncio.ensure_future(ref.wait())
        work = asyncio.ensure_future(main(root)) if main is not None else loop.create_future()
        await asyncio.wait([tree, work, received], return_when=asyncio.FIRST_COMPLETED)
        if tree.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            error = tree.exception()
            if isinstance(error, ActorFailed):
                print(f"error: {error.error}", file=sys.stderr)
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
            print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
            return EXIT_FAILURE
        return int(work.result() or 0)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
