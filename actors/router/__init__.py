"""The session-affinity router: one actor in front of every engine (see actor.py).

The names below load on first use: the run config imports ``actors.router.config``, and that
should not import the actor and its aiohttp server (``slime-async train --help`` stays fast).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "NoEngineAvailable": "actors.router.actor",
    "RouterActor": "actors.router.actor",
    "RouterError": "actors.router.actor",
    "RouterConfig": "actors.router.config",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'actors.router' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
