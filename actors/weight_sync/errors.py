"""The weight sync's errors."""


class WeightSyncError(RuntimeError):
    """The engines cannot take this transport or mode; the message names the engine and the flag."""
