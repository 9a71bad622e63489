#!/usr/bin/env bash
# The test command: install into ./.venv, then run the whole suite (CPU only, 20–22 min on 2 cores).
# Two pytest workers (pytest-xdist), each running whole test files: a run's processes leave a
# core idle at times (a process importing alone, a child starting, a run stopping), which the
# other file's work fills (1,645 s in one worker; 1,176-1,322 s in two, three runs). Whole files:
# a file's module fixtures (its shared runs) start once. Extra arguments go to pytest
# (-n 0: no workers, everything in this process).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup-venv
set +e
.venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
status=$?
set -e
# pytest exits 5 when it collected nothing: a failure, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
