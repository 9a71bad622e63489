"""Settings every test session shares.

CPU engines started by the tests (directly, or by a run the tests start) die on a control
request SGLang 0.5.17's scheduler dies on, as SGLang does on a GPU, instead of refusing it: a
control-plane bug then fails the test where it happens (actors/engine/cpu/preconditions.py).
The engine's --strict-sglang-preconditions flag defaults to this variable, which every child
process inherits; a test of the refusals starts its engine with --no-strict-sglang-preconditions.
Set SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS=0 to run the suite with refusing engines.
"""

import os

# One torch thread per process, for this process and every child it starts (read when torch loads):
# the suite's engines, trainer ranks and runs share 2 cores, where a tiny model only loses time to
# OpenMP hand-offs and spinning threads (tests/e2e/test_rl_run.py: 71 s of wall, 85 s of CPU at the
# default of 2; 59 s, 69 s at 1).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from actors.engine.cpu.preconditions import STRICT_ENV  # noqa: E402

os.environ.setdefault(STRICT_ENV, "1")
