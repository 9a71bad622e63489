"""The weight sync's errors."""


class WeightSyncError(RuntimeError):
    """The engines cannot take this transport or mode; the message names the engine and the flag."""


class NoEngineTakesWeights(WeightSyncError):
    """Every engine refused the current weights as often as they are tried: nothing can generate.
    The message names each engine and its own refusal."""
