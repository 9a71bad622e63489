"""Settings every test session shares.

CPU engines started by the tests (directly, or by a run the tests start) die on a control
request SGLang 0.5.17's scheduler dies on, as SGLang does on a GPU, instead of refusing it: a
control-plane bug then fails the test where it happens (actors/engine/cpu/preconditions.py).
The engine's --strict-sglang-preconditions flag defaults to this variable, which every child
process inherits; a test of the refusals starts its engine with --no-strict-sglang-preconditions.
Set SLIME_ASYNC_STRICT_SGLANG_PRECONDITIONS=0 to run the suite with refusing engines.
"""

import os

from actors.engine.cpu.preconditions import STRICT_ENV

os.environ.setdefault(STRICT_ENV, "1")
