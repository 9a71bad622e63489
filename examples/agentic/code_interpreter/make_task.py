"""Write the code-interpreter task's data: RL prompts, held-out prompts, SFT traces, tokenizer corpus.

    train.jsonl    {"prompt": "What is 347*29+8125?", "label": "18188"}
    heldout.jsonl  the same, expressions never in train.jsonl
    sft.jsonl      {"prompt": ..., "label": [segments]}: code turn (trained), the tool's output
                   (loss mask 0), boxed answer (trained) — the supervised warm start
    corpus.txt     the task's text, for ``python -m examples.models.tiny --corpus``

``--chat-tokenizer DIR`` (any HF tokenizer directory with a chat template, e.g. SmolLM2-135M-
Instruct's) writes prompts as chat messages (a system turn that explains the tool, then the
question) for a run with ``apply_chat_template = true``, after checking that DIR renders them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: examples.agentic...

from examples.agentic.chat import load_chat_tokenizer  # noqa: E402
from examples.agentic.code_interpreter import task  # noqa: E402


def prompt_of(problem: task.Problem, chat: bool) -> str | list[dict[str, str]]:
    if not chat:
        return problem.question
    return [{"role": "system", "content": task.SYSTEM_PROMPT}, {"role": "user", "content": problem.question}]


def check_chat_tokenizer(path: Path) -> None:
    """One line and exit 2 when ``path`` is no tokenizer with a chat template; else how a prompt renders."""
    tokenizer = load_chat_tokenizer(path)
    example = prompt_of(task.Problem("1+2*3", 7), chat=True)
    rendered = tokenizer.apply_chat_template(example, tokenize=False, add_generation_prompt=True)
    print(f"chat prompts render with {path}'s template ({len(tokenizer(rendered)['input_ids'])} tokens each)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=8000, help="training problems")
    parser.add_argument("--heldout", type=int, default=128, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chat-tokenizer", type=Path, help="write chat-message prompts, checked against this tokenizer")
    args = parser.parse_args(argv)
    if args.train <= 0 or args.heldout <= 0:
        parser.error("--train and --heldout must be > 0")
    chat = args.chat_tokenizer is not None
    if chat:
        check_chat_tokenizer(args.chat_tokenizer)
    train, heldout = task.split(args.seed, args.train, args.heldout)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as handle:
            for problem in problems:
                handle.write(json.dumps({"prompt": prompt_of(problem, chat), "label": str(problem.answer)}) + "\n")
    with open(args.out / "sft.jsonl", "w") as handle:
        for problem in train:
            handle.write(json.dumps({"prompt": prompt_of(problem, chat), "label": task.trace_segments(problem)}) + "\n")
    with open(args.out / "corpus.txt", "w") as handle:
        for problem in train:
            handle.write(problem.question + "\n" + "".join(s["text"] for s in task.trace_segments(problem)) + "\n")
        handle.write(task.SYSTEM_PROMPT + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems, {len(train)} SFT traces to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
