"""How engines are quiesced around a weight update: one vocabulary from the flag to the engine.

``--weight-update-mode`` takes these names; the weight sync asks the router for the same one; the
router maps it to the engine's request here (``engine_pause_mode``) and nowhere else.

| mode | requests running on an engine | their KV | versions of their tokens |
|---|---|---|---|
| ``abort`` | returned with finish_reason abort and the tokens so far; resubmitted after the update (partial rollout) | dropped | old before, new after |
| ``drain`` | finish on the old weights; nothing new is sent until the update is done | kept | old |
| ``in_place`` | held by the engine with their KV, continued on the new weights | kept: the old weights computed it | per token |
| ``retract`` | moved back to the engine's waiting queue, re-prefilled after the update | recomputed | per token |

SGLang's ``/pause_generation`` knows ``abort``, ``retract`` and ``in_place``; the router aborts
through ``/abort_request`` (the requests are its own, so it resubmits them), and a drain sends the
engine nothing.

What each mode owes SGLang's scheduler (it asserts, and the server exits, otherwise): a cache flush
needs it idle, and every ``update_weights_from_*`` flushes unless told ``flush_cache: false``. So
only ``abort`` and ``drain`` leave an engine idle before its update (``leaves_engine_idle``); an
update under ``in_place`` or ``retract`` is sent with ``flush_cache: false``, and the prefix cache
is flushed once the engine is next idle.
"""

from __future__ import annotations

from typing import Literal, get_args

QuiesceMode = Literal["abort", "drain", "in_place", "retract"]
QUIESCE_MODES: tuple[str, ...] = get_args(QuiesceMode)

# The names of earlier releases, accepted with a one-line warning.
RENAMED = {"pause": "drain"}

# The engine's /pause_generation mode for each quiesce mode (None: no pause request).
_ENGINE_PAUSE: dict[str, str | None] = {"abort": None, "drain": None, "in_place": "in_place", "retract": "retract"}


def check_mode(mode: str, where: str = "--weight-update-mode") -> QuiesceMode:
    """``mode`` if it is one of the quiesce modes; a one-line ValueError naming ``where`` otherwise."""
    if mode not in QUIESCE_MODES:
        raise ValueError(f"{where}: {mode!r} is not one of {', '.join(QUIESCE_MODES)}")
    return mode  # type: ignore[return-value]


def engine_pause_mode(mode: QuiesceMode) -> str | None:
    """The mode of the engine's ``/pause_generation`` request that ``mode`` sends, if any."""
    return _ENGINE_PAUSE[check_mode(mode, "quiesce mode")]


def leaves_engine_idle(mode: QuiesceMode) -> bool:
    """Whether the engine has no request left running once the router has quiesced it in ``mode``
    (then an update may flush the prefix cache; otherwise it must not)."""
    return engine_pause_mode(mode) is None
