"""SGLang 0.5.17's preconditions on control requests, and what the CPU engine does when one is broken.

SGLang checks these inside its scheduler process, where nothing catches the error: the scheduler
logs ``Scheduler hit an exception: <traceback>``, signals its parent, and the whole server dies
(managers/scheduler.py, run_scheduler_process). DESIGN.md, "Preconditions are part of the
contract": the runtime must never send such a request, and a CPU test has to notice when it does.

The preconditions (the name each is counted under in /server_info ``precondition_violations``):

  flush_cache_after_weight_update     an update_weights_from_{disk,distributed,tensor} (or a delta
                                      load) with flush_cache true while the scheduler is not fully
                                      idle: ``AssertionError: Cache flush failed after updating weights``
  release_memory_occupation_idle      a release while not fully idle: ``AssertionError:
                                      release_memory_occupation should be called only when server is idle.``
  resume_memory_occupation_released   a resume of a tag that is not released: ``KeyError: 'weights'``
  weights_update_group_exists         update_weights_from_distributed on a group never initialised:
                                      ``AssertionError: Group X not in [...]. Please call
                                      `init_weights_update_group` first.``
  weights_update_group_name           init_weights_update_group with group_name "":
                                      ``AssertionError: Group name cannot be empty``
  update_weights_from_tensor_payloads fewer serialized_named_tensors than TP ranks (1 here):
                                      ``IndexError: list index out of range``
  update_weights_from_tensor_load     a tensor update SGLang's loader raises on (a payload that does not
                                      unpickle, an unknown load_format, a shape mismatch): uncaught there

"Fully idle" is SGLang's ``is_fully_idle``: nothing running (requests paused in place, aborted or
not, still count) and nothing in the waiting queue (retracted requests sit there). Requests that
arrive while generation is paused are held before the scheduler, as SGLang's tokenizer holds
them, and do not count.

Two behaviours:
  default   refuse before anything changes: HTTP 400 whose message holds SGLang's error and why
            (how many requests run and wait), counted by name;
  strict    (``--strict-sglang-preconditions``) do what SGLang does: log SGLang's error as its
            scheduler does and exit the process with EXIT_CODE, so a test sees the engine die at
            the request that would kill SGLang.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from typing import NoReturn

logger = logging.getLogger("cpu_engine")

# The scheduler-died code of scheduler.py: this is the same event, as SGLang sees it.
EXIT_CODE = 70
# The test suite's switch (tests/conftest.py sets it; the CPU engine's flag defaults to it).
STRICT_ENV = "SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS"

NAMES = (
    "flush_cache_after_weight_update",
    "release_memory_occupation_idle",
    "resume_memory_occupation_released",
    "weights_update_group_exists",
    "weights_update_group_name",
    "update_weights_from_tensor_payloads",
    "update_weights_from_tensor_load",
)


def strict_from_env(environ: dict[str, str] | None = None) -> bool:
    """The default of ``--strict-sglang-preconditions``: $SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS."""
    value = (os.environ if environ is None else environ).get(STRICT_ENV, "").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"${STRICT_ENV} must be 1 or 0 (true/false), got {value!r}")


class PreconditionViolation(Exception):
    """A request SGLang 0.5.17 would die on, refused before it changed anything."""

    def __init__(self, name: str, error: BaseException, why: str) -> None:
        self.name = name
        self.error = error
        self.why = why
        super().__init__(f"{_describe(error)} ({why}). SGLang 0.5.17's scheduler raises this here and the server "
                         f"dies; the CPU engine refused the request before changing anything "
                         f"(precondition {name!r}; --strict-sglang-preconditions exits instead)")


class Preconditions:
    """Counts broken preconditions (default) or ends the process on the first one (strict).

    ``violated`` may be called from the scheduler thread or the event loop.
    """

    def __init__(self, strict: bool = False) -> None:
        self.strict = strict
        self._counts = dict.fromkeys(NAMES, 0)
        self._lock = threading.Lock()

    def violated(self, name: str, error: BaseException, why: str) -> NoReturn:
        """Raise PreconditionViolation, or in strict mode log SGLang's error and exit."""
        if name not in self._counts:
            raise ValueError(f"unknown precondition {name!r}; one of {NAMES}")
        if self.strict:
            _die_as_sglang(name, error, why)
        with self._lock:
            self._counts[name] += 1
        logger.error("precondition %s broken, request refused: %s (%s)", name, _describe(error), why)
        raise PreconditionViolation(name, error, why)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"  # as the last line of a traceback, unqualified


def _die_as_sglang(name: str, error: BaseException, why: str) -> NoReturn:
    try:
        raise error
    except BaseException:  # noqa: BLE001 - formatted, as SGLang's run_scheduler_process does
        trace = traceback.format_exc()
    # SGLang's own line ("Scheduler hit an exception: " + the traceback), then ours.
    logger.critical("Scheduler hit an exception: %s", trace)
    logger.critical("cpu engine: --strict-sglang-preconditions: precondition %s broken (%s); exiting with "
                    "code %d where SGLang 0.5.17's server dies", name, why, EXIT_CODE)
    for handler in logging.getLogger().handlers + logger.handlers:
        handler.flush()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(EXIT_CODE)
