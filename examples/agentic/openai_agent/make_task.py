"""Write the OpenAI-agent example's data: the code-interpreter task as chat episodes.

    train.jsonl / heldout.jsonl  {"prompt": "What is 583*81-203?", "label": "47020"} (the agent
                                 makes the user message of the prompt)
    sft.jsonl                    ideal episodes rendered by the chat template with the tools, as
                                 ``--loss-type sft`` segments: the assistant's tool call and final
                                 answer trained, the template glue and the tool's output not —
                                 split where the router front splits a recorded trajectory
    corpus.txt                   the rendered episodes, for ``python -m examples.models.tiny --corpus``

The problems are the code interpreter's with a positive answer of ``--answer-digits`` (5) digits
(so each has a multiplication): the box's k-th digit then copies the tool output's k-th digit from
a fixed distance back, which the tiny model learns in a short warm start; with answers of one to
six digits and a sign it kept mis-copying (``266`` -> ``\\boxed{226}``) after 200 steps.

The template is ``--model DIR``'s (its tokenizer must render ``tools`` and tool calls), by
default the tiny model's tool template (``python -m examples.models.tiny --chat-template tools``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: examples.agentic...

from actors.router.tool_calls import template_messages  # noqa: E402
from examples.agentic.chat import load_chat_tokenizer  # noqa: E402
from examples.agentic.code_interpreter import task  # noqa: E402
from examples.agentic.openai_agent.agent import TOOLS, conversation  # noqa: E402

END_OF_TURN = "<|im_end|>"  # where a model turn ends in ChatML templates (the model writes it)


def load_template_tokenizer(model: Path | None) -> Any:
    if model is None:
        from examples.models.tiny import TOOL_CHAT_TEMPLATE, train_tokenizer

        tokenizer = train_tokenizer(300, 0, corpus=["x"])  # only its template is used here
        tokenizer.chat_template = TOOL_CHAT_TEMPLATE
        return tokenizer
    return load_chat_tokenizer(model, flag="--model")


def split(seed: int, train: int, heldout: int, answer_digits: int) -> tuple[list[task.Problem], list[task.Problem]]:
    """``(train, heldout)`` problems whose answers are positive with ``answer_digits`` digits,
    distinct expressions, deterministic in ``seed``."""
    return task.split(seed, train, heldout, keep=lambda p: p.answer > 0 and len(str(p.answer)) == answer_digits)


def episode_segments(tokenizer: Any, problem: task.Problem) -> tuple[str, list[dict[str, Any]]]:
    """``(prompt text, SFT segments)`` of the ideal episode, cut from successive renders."""
    return cut_episode(tokenizer, conversation(problem), TOOLS)


def cut_episode(tokenizer: Any, conversation: list[dict[str, Any]], tools: list[dict[str, Any]]
                ) -> tuple[str, list[dict[str, Any]]]:
    """``(prompt text, SFT segments)`` of an episode (chat messages up to the first assistant turn
    are the prompt), cut from successive renders where the front's recording cuts it: each
    assistant turn trained up to its end-of-turn token, the rest (glue, tool output) not."""
    messages = template_messages(conversation)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")

    def render(upto: int, generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tools=tools, tokenize=False,
                                             add_generation_prompt=generation_prompt)

    prompt = render(first, True)
    segments, done = [], prompt
    for upto in range(first + 1, len(messages) + 1):
        train = messages[upto - 1]["role"] == "assistant"
        text = render(upto, generation_prompt=not train)
        if not text.startswith(done):
            raise SystemExit("the chat template re-renders earlier turns differently; its episodes cannot be "
                             "captured as one trajectory")
        piece = text[len(done):]
        if train:  # the model's turn ends with the end-of-turn token it writes; the newline is glue
            piece = piece[:piece.index(END_OF_TURN) + len(END_OF_TURN)]
        segments.append({"text": piece, "train": train})
        done += piece
    return prompt, segments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=20000, help="training problems")
    parser.add_argument("--heldout", type=int, default=128, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, help="render with this tokenizer's chat template")
    parser.add_argument("--answer-digits", type=int, default=5, help="digits of every answer (3 to 5)")
    args = parser.parse_args(argv)
    if args.train <= 0 or args.heldout <= 0:
        parser.error("--train and --heldout must be > 0")
    if not 3 <= args.answer_digits <= 5:  # the problems' answers: up to six digits, rarely six
        parser.error(f"--answer-digits must be 3, 4 or 5, got {args.answer_digits}")
    tokenizer = load_template_tokenizer(args.model)
    train, heldout = split(args.seed, args.train, args.heldout, args.answer_digits)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as handle:
            for problem in problems:
                handle.write(json.dumps({"prompt": problem.question, "label": str(problem.answer)}) + "\n")
    with open(args.out / "sft.jsonl", "w") as sft, open(args.out / "corpus.txt", "w") as corpus:
        for problem in train:
            prompt, segments = episode_segments(tokenizer, problem)
            sft.write(json.dumps({"prompt": prompt, "label": segments}) + "\n")
            corpus.write(prompt + "".join(s["text"] for s in segments) + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems, {len(train)} SFT episodes to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
