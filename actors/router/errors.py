"""Errors of the router (in their own module: the actor and its HTTP front both raise them)."""


class RouterError(RuntimeError):
    """A request the router could not serve; the message names the engines it tried."""


class NoEngineAvailable(RouterError):
    """No engine came up within ``--router-no-engine-timeout``."""
