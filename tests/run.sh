#!/usr/bin/env bash
# The test command: install into ./.venv, then run the whole suite (CPU only, 27–28 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup-venv
set +e
.venv/bin/python -m pytest -q "$@"
status=$?
set -e
# pytest exits 5 when it collected nothing: a failure, not a pass.
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$status"
