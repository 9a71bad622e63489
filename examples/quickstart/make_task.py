"""Generate the quick start's verifiable task: addition of two small numbers.

Writes train.jsonl (prompts with labels, for the SFT warm start and for RL) and heldout.jsonl
(pairs never seen in training). A row: {"prompt": "12+7=", "label": "19"}. The reward is an
exact match of the model's answer with the label.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--max-operand", type=int, default=99)
    parser.add_argument("--heldout", type=int, default=128, help="held-out pairs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pairs = [(a, b) for a in range(args.max_operand + 1) for b in range(args.max_operand + 1)]
    random.Random(args.seed).shuffle(pairs)
    heldout, train = pairs[: args.heldout], pairs[args.heldout:]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as handle:
            for a, b in rows:
                handle.write(json.dumps({"prompt": f"{a}+{b}=", "label": str(a + b)}) + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
