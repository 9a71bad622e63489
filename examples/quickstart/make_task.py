"""Generate the quick start's verifiable task: reverse a string of digits.

Writes train.jsonl (prompts with labels, for the SFT warm start and for RL) and heldout.jsonl
(strings never seen in training). A row: {"prompt": "reverse 4072:", "label": "2704"}. The
reward is an exact match of the model's answer with the label. A tiny transformer learns this
in minutes on a CPU, which is what a quick start needs; swap in your own data for real work.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--min-len", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=5)
    parser.add_argument("--train", type=int, default=4000, help="training strings")
    parser.add_argument("--heldout", type=int, default=128, help="held-out strings")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    strings: list[str] = []
    seen: set[str] = set()
    while len(strings) < args.train + args.heldout:
        text = "".join(rng.choice("0123456789") for _ in range(rng.randint(args.min_len, args.max_len)))
        if text not in seen:
            seen.add(text)
            strings.append(text)
    heldout, train = strings[: args.heldout], strings[args.heldout:]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as handle:
            for text in rows:
                handle.write(json.dumps({"prompt": f"reverse {text}:", "label": text[::-1]}) + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
