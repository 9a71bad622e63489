"""Write the search example's data: corpus, RL prompts, held-out prompts, SFT traces, settings.

    python examples/agentic/search/prepare.py --out DIR [--chat-tokenizer MODEL_DIR]

DIR gets ``corpus.jsonl`` (one passage a row), ``train.jsonl`` / ``heldout.jsonl`` (``{"prompt",
"label"}``: the question and its answer), ``sft.jsonl`` (the same prompts with the search trace as
a segmented label: model turns trained, retrieved passages not), ``settings.yaml`` (what the
generate hook reads through ``--custom-config-path``) and ``tokenizer_corpus.txt`` (text for
``python -m examples.models.tiny --corpus``). Prompts are plain text (``Question: ...``) for the tiny
model; with ``--chat-tokenizer`` (any HF tokenizer directory with a chat template, e.g.
SmolLM2-135M-Instruct) they are chat messages — the rules as a system message, the question as
the user's — for runs with ``--apply-chat-template``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: run as a script
from examples.agentic.chat import load_chat_tokenizer  # noqa: E402
from examples.agentic.search import retriever, task  # noqa: E402


def prompt_of(question: task.Question, chat: bool):
    if chat:
        return [{"role": "system", "content": task.SYSTEM_PROMPT}, {"role": "user", "content": question.text}]
    return f"Question: {question.text}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heldout-people", type=int, default=64, help="people whose two questions are held out")
    parser.add_argument("--top-k", type=int, default=1, help="passages per search")
    parser.add_argument("--max-turns", type=int, default=4, help="model turns per sample")
    parser.add_argument("--evidence-credit", type=float, default=0.25,
                        help="training reward of a wrong answer whose searches retrieved the answer's passage")
    parser.add_argument("--chat-tokenizer", type=Path, help="write prompts as chat messages for this tokenizer")
    args = parser.parse_args(argv)
    if args.top_k < 1 or args.max_turns < 3:
        parser.error("--top-k must be >= 1 and --max-turns >= 3 (two searches and an answer)")
    if not 0.0 <= args.evidence_credit < 1.0:
        parser.error("--evidence-credit must be in [0, 1): the right answer must stay worth the most")
    if args.chat_tokenizer is not None:
        load_chat_tokenizer(args.chat_tokenizer)
    chat = args.chat_tokenizer is not None

    world = task.make_world(args.seed)
    passages = world.passages()
    index = retriever.Retriever(passages)
    train, heldout = task.split_questions(world, args.heldout_people)
    random.Random(args.seed).shuffle(train)

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.jsonl").write_text("".join(json.dumps({"id": i, "text": p}) + "\n" for i, p in enumerate(passages)))
    search = lambda query: index.search(query, args.top_k)  # noqa: E731
    traces = {q: task.trace(world, q, search) for q in train}
    for name, rows in (("train.jsonl", [(q, world.answer(q.person, q.relation)) for q in train]),
                       ("heldout.jsonl", [(q, world.answer(q.person, q.relation)) for q in heldout]),
                       ("sft.jsonl", [(q, [{"text": t, "train": m} for t, m in traces[q]]) for q in train])):
        with open(out / name, "w") as handle:
            for question, label in rows:
                row = {"prompt": prompt_of(question, chat), "label": label}
                if name != "sft.jsonl":  # the passage that holds the answer: the hook's partial credit and metric
                    row["metadata"] = {"evidence": task.city_passage(world, world.people[question.person],
                                                                     question.relation)}
                handle.write(json.dumps(row) + "\n")
    settings = {"corpus": str((out / "corpus.jsonl").resolve()), "top_k": args.top_k, "max_turns": args.max_turns,
                "evidence_credit": args.evidence_credit}
    (out / "settings.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in settings.items()))
    lines = passages + [prompt_of(q, False) + "".join(t for t, _ in traces[q]) for q in train]
    (out / "tokenizer_corpus.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(passages)} passages, {len(train)} training and {len(heldout)} held-out questions to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
