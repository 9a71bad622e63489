"""The session-affinity router: one actor in front of every engine (see actor.py)."""

from actors.router.actor import NoEngineAvailable, RouterActor, RouterError
from actors.router.config import RouterConfig

__all__ = ["NoEngineAvailable", "RouterActor", "RouterConfig", "RouterError"]
