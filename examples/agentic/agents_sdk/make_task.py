"""Write the Agents SDK example's data: the OpenAI agent example's problems, with the ideal
episodes rendered as the SDK's requests render them.

    train.jsonl / heldout.jsonl  {"prompt": "What is 583*81-203?", "label": "47020"} (the SDK sends
                                 the prompt as the user turn, after its instructions' system turn)
    sft.jsonl                    ideal episodes as ``--loss-type sft`` segments, cut where the
                                 front's recording cuts a trajectory (model turns trained)
    corpus.txt                   the rendered episodes, for ``python -m examples.models.tiny --corpus``

The SDK renders its request its own way, and the warm start must train the tokens its turns
really produce: the system turn is the agent's ``instructions``; the tool is the SDK's schema of
the ``@function_tool`` (``Converter.tool_to_openai``: its docstring's description, ``title``
fields, ``additionalProperties: false``, ``"strict": true``); the assistant's call goes back as
``tool_calls`` with no content, the output as a ``tool`` message. Flags as the OpenAI agent's
``make_task.py``, plus ``--model-api`` (the agent's ``model_api``: the
Responses path renders the tool without ``strict``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: examples.agentic...

from agents.models.chatcmpl_converter import Converter  # noqa: E402
from agents.models.openai_responses import Converter as ResponsesConverter  # noqa: E402

from actors.router.responses_protocol import parse_responses  # noqa: E402

from examples.agentic.agents_sdk.agent import INSTRUCTIONS, MODEL_APIS, run_python  # noqa: E402
from examples.agentic.code_interpreter import task  # noqa: E402
from examples.agentic.openai_agent.agent import conversation  # noqa: E402
from examples.agentic.openai_agent.make_task import cut_episode, load_template_tokenizer, split  # noqa: E402


def sdk_tools(model_api: str = "chat_completions") -> list[dict[str, Any]]:
    """The tools as the template renders the SDK's request on ``model_api``: the Chat Completions
    model's as sent; the Responses model's flat function tools as the front turns them into chat
    tools (name, description, parameters: ``strict`` is not rendered)."""
    if model_api == "responses":
        body = {"model": "policy", "input": "-", "tools": ResponsesConverter.convert_tools([run_python], []).tools}
        return parse_responses(body).chat_tools
    return [dict(Converter.tool_to_openai(run_python))]


def sdk_conversation(problem: task.Problem) -> list[dict[str, Any]]:
    """The ideal episode as the SDK sends it: its instructions first, the call without content."""
    user, call, output, answer = conversation(problem)
    call = {key: value for key, value in call.items() if key != "content"}
    return [{"role": "system", "content": INSTRUCTIONS}, user, call, output, answer]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train", type=int, default=20000, help="training problems")
    parser.add_argument("--heldout", type=int, default=128, help="held-out problems")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", type=Path, help="render with this tokenizer's chat template")
    parser.add_argument("--answer-digits", type=int, default=5, help="digits of every answer (3 to 5)")
    parser.add_argument("--model-api", default="chat_completions", choices=MODEL_APIS,
                        help="render the requests of this SDK model (agent.yaml's model_api)")
    args = parser.parse_args(argv)
    if args.train <= 0 or args.heldout <= 0:
        parser.error("--train and --heldout must be > 0")
    if not 3 <= args.answer_digits <= 5:
        parser.error(f"--answer-digits must be 3, 4 or 5, got {args.answer_digits}")
    tokenizer = load_template_tokenizer(args.model)
    train, heldout = split(args.seed, args.train, args.heldout, args.answer_digits)
    tools = sdk_tools(args.model_api)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, problems in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        with open(args.out / name, "w") as handle:
            for problem in problems:
                handle.write(json.dumps({"prompt": problem.question, "label": str(problem.answer)}) + "\n")
    with open(args.out / "sft.jsonl", "w") as sft, open(args.out / "corpus.txt", "w") as corpus:
        for problem in train:
            prompt, segments = cut_episode(tokenizer, sdk_conversation(problem), tools)
            sft.write(json.dumps({"prompt": prompt, "label": segments}) + "\n")
            corpus.write(prompt + "".join(s["text"] for s in segments) + "\n")
    print(f"wrote {len(train)} training and {len(heldout)} held-out problems, {len(train)} SFT episodes to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
