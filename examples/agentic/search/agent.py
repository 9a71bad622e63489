"""Search-R1-style agent: the generate hook and the reward of the search example.

Each model turn ends at ``</search>`` or ``</answer>`` (text stop strings) or EOS. After a search
call the hook retrieves the top-k passages (BM25, ``retriever.py``) and appends them as an
``<information>…</information>`` observation with loss mask 0, up to ``max_turns`` model turns;
the final ``<answer>…</answer>`` is graded by exact match. A training sample whose answer is wrong
but whose searches retrieved the passage holding the answer (the prompt row's
``metadata.evidence``) gets ``evidence_credit`` instead of 0; evaluation is exact match only.
Searches, turns and ``evidence`` (that passage retrieved: 1/0) per sample go to
``sample.metadata["metrics"]`` (logged as ``rollout/searches``, ``eval/evidence``, ...).

The hook path is ``examples.agentic.search.agent:generate`` with the repository root on
``PYTHONPATH`` (``run.sh`` sets it). Settings come from ``--custom-config-path`` (YAML written by ``prepare.py``): ``corpus`` (JSONL
path), ``top_k`` (1), ``max_turns`` (4), ``turn_tokens`` (tokens per model turn, 24),
``evidence_credit`` (0.0: the reward of a wrong answer after the right second search).
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from . import retriever, task

STOPS = ("</search>", "</answer>")


@functools.lru_cache(maxsize=4)
def _settings(path: str | None) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load(Path(path).read_text()) if path else {}
    if not data or "corpus" not in data:
        raise ValueError("the search example needs --custom-config-path with a 'corpus' setting (prepare.py writes it)")
    return {"top_k": 1, "max_turns": 4, "turn_tokens": 24, "evidence_credit": 0.0, **data}


async def generate(ctx, sample, sampling_params, evaluation: bool = False):
    settings = _settings(ctx.config.custom_config_path)
    search_index = retriever.load(str(settings["corpus"]))
    budget = sampling_params["max_new_tokens"]  # model tokens over all turns
    searches = turns = 0
    retrieved: list[str] = []
    finish = "length"
    while turns < settings["max_turns"] and budget > 0:
        start = sample.response_length
        finish = await ctx.generate_turn(sample, sampling_params, max_new_tokens=min(budget, settings["turn_tokens"]),
                                         stop=STOPS)
        turns += 1
        budget -= sample.response_length - start
        text = ctx.tokenizer.decode(sample.tokens[len(sample.tokens) - (sample.response_length - start):],
                                    skip_special_tokens=True)
        query = task.last_search_query(text) if finish == "stop" else None
        if query is None or turns == settings["max_turns"]:
            break
        passages = await asyncio.to_thread(search_index.search, query, settings["top_k"])
        retrieved += passages
        sample.append_observation(ctx.tokenizer(task.information(passages), add_special_tokens=False)["input_ids"])
        searches += 1
    evidence = sample.metadata.get("evidence")
    found = evidence is not None and evidence in retrieved
    # Partial credit is for training only: held-out reward stays the exact match of the answer.
    sample.metadata["evidence_found"] = found and not evaluation
    sample.metadata["metrics"] = {"searches": searches, "turns": turns}
    if evidence is not None:
        sample.metadata["metrics"]["evidence"] = int(found)
    sample.status = sample.Status.TRUNCATED if finish == "length" else sample.Status.COMPLETED
    return sample


async def reward(ctx, sample) -> float:
    settings = _settings(ctx.config.custom_config_path)
    return task.grade(sample.response, str(sample.label), evidence_found=bool(sample.metadata.get("evidence_found")),
                      evidence_credit=float(settings["evidence_credit"]))
