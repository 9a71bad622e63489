"""Colocated training on the CPU engine: which memory regions (SGLang's tags) are released.

The routes (``/release_memory_occupation``, ``/resume_memory_occupation``,
``/update_weights_from_tensor``) are the server's (actors/engine/cpu/server.py); this module
only keeps the state and its rules.

Released weights are really freed (the process's memory drops) and come back as zeros: the
engine refuses to generate while any region is released, and after a resume until every
weight has been loaded again, so it never serves half-updated or undefined weights. Release
needs a fully idle scheduler and resume a released tag, as SGLang's do (its scheduler asserts
``is_fully_idle``, and removes each tag from a set, KeyError if absent); both are preconditions
SGLang dies on (preconditions.py).
"""

from __future__ import annotations

from typing import Any

from actors.engine.cpu.model_runner import ModelRunner
from actors.engine.cpu.preconditions import Preconditions
from slime_async.memory_stats import peak_rss_bytes, rss_bytes

# SGLang's GPU_MEMORY_ALL_TYPES, in its order (what no tags means); the CPU engine has no CUDA
# graphs, so that tag frees nothing.
TAGS = ("kv_cache", "weights", "cuda_graph")


class MemoryStateError(ValueError):
    """A release or resume the engine's state does not allow; nothing changed."""


class MemoryOccupation:
    """Which memory regions of one engine are released.

    ``release`` and ``resume`` run on the scheduler thread (between two steps), so they are
    ordered with its admissions; ``refusal`` and ``describe`` may run on the event loop too.
    ``released`` is a frozenset replaced whole, never mutated, so a reader on another thread
    sees one state or the other, not a set changing under its iteration.
    """

    def __init__(self, runner: ModelRunner, preconditions: Preconditions | None = None) -> None:
        self.runner = runner
        self.preconditions = preconditions or Preconditions()
        self.released: frozenset[str] = frozenset()

    def release(self, tags: list[str], loads: dict[str, Any], flush_cache: Any) -> str:
        """Free ``tags`` (scheduler thread); ``loads`` is the scheduler's, ``flush_cache`` empties its prefix cache."""
        if not loads["fully_idle"]:
            self.preconditions.violated(
                "release_memory_occupation_idle",
                AssertionError("release_memory_occupation should be called only when server is idle."),
                f"{loads['num_running_reqs']} running and {loads['num_waiting_reqs']} waiting request(s)"
                f"{', generation paused' if loads['paused'] else ''}; abort them, then /flush_cache?timeout=T "
                "answers once the scheduler is idle")
        again = sorted(set(tags) & self.released)
        if again:
            raise MemoryStateError(f"memory already released: {', '.join(again)}")
        freed = 0
        if "kv_cache" in tags:
            flush_cache()  # finished sequences' KV lives in the prefix cache only
        # Marked before the weights go, so no admission between the two can see them half freed
        # (both run on the scheduler thread; this is for readers on the event loop).
        self.released = self.released | frozenset(tags)
        if "weights" in tags:
            freed = self.runner.release_weights()
        return f"released {', '.join(tags)} ({freed} bytes of weights freed)"

    def resume(self, tags: list[str]) -> str:
        """Allocate ``tags`` again (scheduler thread); the weights stay unservable until all are loaded."""
        missing = [tag for tag in tags if tag not in self.released]
        if missing:
            self.preconditions.violated(
                "resume_memory_occupation_released", KeyError(missing[0]),
                f"memory not released, cannot resume: {', '.join(missing)} (released: "
                f"{', '.join(sorted(self.released)) or 'nothing'})")
        if "weights" in tags:
            self.runner.resume_weights()
        self.released = self.released - frozenset(tags)
        return f"resumed {', '.join(tags)}"

    def refusal(self) -> str | None:
        """Why the engine cannot generate now, or None."""
        released = self.released
        if not released and self.runner.can_serve:
            return None
        if released:
            return (f"the engine's memory is released ({', '.join(sorted(released))}): it cannot generate "
                    "until /resume_memory_occupation and a weight update")
        unloaded = self.runner.unloaded_weights()
        return (f"the engine's weights are incomplete: {len(unloaded)} tensor(s) not loaded since "
                f"/resume_memory_occupation, e.g. {unloaded[0] if unloaded else '?'!r}")

    def describe(self, reset_peak: bool = False) -> dict[str, Any]:
        """For /get_server_info: what is released, the weights' bytes, the process's memory."""
        return {"released": sorted(self.released), "weight_bytes": self.runner.weight_bytes(),
                "unloaded_weights": len(self.runner.unloaded_weights()), "rss_bytes": rss_bytes(),
                "peak_rss_bytes": peak_rss_bytes(reset=reset_peak)}
