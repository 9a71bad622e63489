"""Data for a verifiers example: the env's prompt rows, and ideal episodes for the warm start.

    python examples/verifiers/sft_data.py --config examples/verifiers/<name>/env.yaml --out DIR

writes, from the environment the settings name (``env_id``, ``env_args``):

    train.jsonl / heldout.jsonl  the env's dataset and eval dataset (``slime-async prepare-verifiers``)
    sft.jsonl                    one ideal episode per training row, rendered by the tiny model's tool
                                 chat template with the env's tools as verifiers sends them, as
                                 ``--loss-type sft`` segments cut where the router front's recording cuts
                                 (the assistant's turns trained, the glue and tool output not)
    corpus.txt                   the rendered episodes, for ``python -m examples.models.tiny --corpus``

The ideal episode is the example's own (``episode(row) -> assistant/tool messages``, in the
example's ``episodes.py``); it is not part of the environment, which only prompts and scores.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from actors.rollout import verifiers_env  # noqa: E402
from examples.agentic.openai_agent.make_task import cut_episode, load_template_tokenizer  # noqa: E402


def native_tools(env: Any) -> list[dict[str, Any]] | None:
    """The env's tools as its verifiers client sends them (``tools`` of each chat completion)."""
    if not env.tool_defs:
        return None
    import openai

    vf = verifiers_env.require_verifiers()
    client = vf.OpenAIChatCompletionsClient(openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:1"))
    return [dict(tool) for tool in asyncio.run(client.to_native_tools(env.tool_defs))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the example's env.yaml")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", type=Path, help="render with this tokenizer's chat template (default: the tiny tool one)")
    args = parser.parse_args(argv)
    if verifiers_env.main(["--config", args.config, "--out", str(args.out)]) != 0:
        return 2
    config = verifiers_env.settings(args.config)
    env = verifiers_env.load_env(config.env_id, config.env_args)
    episode = importlib.import_module(config.env_id.rsplit(".", 1)[0] + ".episodes").episode
    tokenizer = load_template_tokenizer(args.model)
    tools = native_tools(env)
    rows = [json.loads(line) for line in (args.out / "train.jsonl").read_text().splitlines()]
    with open(args.out / "sft.jsonl", "w") as sft, open(args.out / "corpus.txt", "w") as corpus:
        for row in rows:
            data = row["metadata"][verifiers_env.METADATA_KEY]["input"]
            prompt, segments = cut_episode(tokenizer, row["prompt"] + episode(data), tools)
            sft.write(json.dumps({"prompt": prompt, "label": segments}) + "\n")
            corpus.write(prompt + "".join(s["text"] for s in segments) + "\n")
    print(f"wrote {len(rows)} SFT episodes to {args.out / 'sft.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
