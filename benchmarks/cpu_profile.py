"""Run a module under cProfile timed by the main thread's CPU clock, not the wall clock.

    python -m benchmarks.cpu_profile OUT.prof MODULE [ARGS ...]

``python -m cProfile`` times with the wall clock, so in a process with a second thread (the
router's tokenizer thread) every wait of the main thread for the GIL is charged to whatever
function it was in: a dict lookup shows up as 40 us. ``time.thread_time`` counts only the main
thread's CPU, which is what holds the event loop. The stats are written when the module
returns or exits (SIGTERM is turned into an exit, so the dump happens).
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
import time


def main() -> None:
    out, module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    # the router handles SIGTERM itself (run_supervised); this is for modules that do not
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    profile = cProfile.Profile(time.thread_time)
    try:
        profile.runcall(runpy.run_module, module, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    main()
