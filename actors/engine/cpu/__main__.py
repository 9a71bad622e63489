"""`python -m actors.engine.cpu --model-path DIR` runs the CPU engine server."""

import sys

from actors.engine.cpu.config import parse_args

# Check flags and the model dir before paying for torch/transformers imports.
try:
    parse_args(sys.argv[1:]).validate()
except ValueError as exc:
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None

from actors.engine.cpu.server import main  # noqa: E402 - deliberately after the cheap checks

raise SystemExit(main(sys.argv[1:]))
