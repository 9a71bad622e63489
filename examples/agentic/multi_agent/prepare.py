"""Write the multi-agent example's data: RL prompts, held-out prompts, SFT traces, tokenizer text.

    python examples/agentic/multi_agent/prepare.py --out DIR [--chat-tokenizer MODEL_DIR]

``train.jsonl`` / ``heldout.jsonl`` rows are ``{"prompt", "label"}`` (the reversed string);
``sft.jsonl`` holds the same prompts with a three-role trace as a segmented label (role prompts
and wrong first answers not trained); ``tokenizer_corpus.txt`` is for
``python -m examples.models.tiny --corpus``. With ``--chat-tokenizer`` (a tokenizer directory with
a chat template) prompts are chat messages, and the SFT traces render the role prompts and turn
ends with that template, as the hook does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: run as a script
from examples.agentic.chat import load_chat_tokenizer  # noqa: E402
from examples.agentic.multi_agent import agent, task  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--heldout", type=int, default=128)
    parser.add_argument("--noise", type=float, default=0.5, help="share of SFT traces whose first answer is wrong")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-tokenizer", type=Path, help="write prompts as chat messages for this tokenizer")
    args = parser.parse_args(argv)
    tokenizer = None
    if args.chat_tokenizer is not None:
        tokenizer = load_chat_tokenizer(args.chat_tokenizer)
    chat = tokenizer is not None
    strings = task.make_strings(args.seed, args.train + args.heldout)
    heldout, train = strings[: args.heldout], strings[args.heldout:]
    rng = random.Random(args.seed)

    def prompt(digits: str):
        return [{"role": "user", "content": task.problem(digits)}] if chat else task.problem(digits) + "\n"

    def segments(digits: str) -> list[dict]:
        if not chat:
            return [{"text": text, "train": trained} for text, trained in task.trace(digits, rng, args.noise)]
        # Chat: each model turn ends with the template's end-of-turn token, which the model writes.
        (first, first_ok), _, (verdict, _), _, (final, _) = task.trace(digits, rng, args.noise)
        out = []
        for model_text, trained, role in ((first, first_ok, task.CRITIC_PROMPT), (verdict, True, task.REVISE_PROMPT)):
            rendered = agent.role_prompt(tokenizer, role, True)
            end = agent.turn_end(tokenizer, rendered)
            out += [{"text": model_text.rstrip("\n") + end, "train": trained},
                    {"text": rendered[len(end):], "train": False}]
        return out + [{"text": final.rstrip("\n"), "train": True}]  # SFT appends the EOS

    args.out.mkdir(parents=True, exist_ok=True)
    sft = [{"prompt": prompt(d), "label": segments(d)} for d in train]
    for name, rows in (("train.jsonl", [{"prompt": prompt(d), "label": d[::-1]} for d in train]),
                       ("heldout.jsonl", [{"prompt": prompt(d), "label": d[::-1]} for d in heldout]),
                       ("sft.jsonl", sft)):
        (args.out / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    lines = [task.problem(d) + "\n" + "".join(s["text"] for s in row["label"]) for d, row in zip(train, sft)]
    (args.out / "tokenizer_corpus.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
