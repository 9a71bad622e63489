"""Networking helpers: loopback ports, and serving an HTTP app until a signal."""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


async def serve_until_signalled(runner: "web.AppRunner") -> None:
    """Serve an aiohttp ``runner`` (already set up and listening) until SIGINT or SIGTERM, then clean it up."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
