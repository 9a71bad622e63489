"""ReTool-style code interpreter: the generate hook and the reward of the code_interpreter example.

Each model turn ends at the closing fence of a ```python block (a text stop string) or at EOS.
The hook runs the block's code in the sandbox (``slime_async.sandbox``) and appends its output as
an ```output block — an observation, loss mask 0 — then lets the model go on, up to
``max_tool_calls`` calls; the turn without a code block is the final answer, graded by exact
match of its ``\\boxed{}``. Tool calls (code, output, exit code) are kept in
``sample.metadata["tool_calls"]``; calls, errors and turns per sample go to
``sample.metadata["metrics"]`` (logged as ``rollout/tool_calls``, ``eval/turns``, ...).

Hook paths: ``examples.agentic.code_interpreter.agent:generate`` and ``...agent:reward``, with
the repository root on ``PYTHONPATH`` (``run.sh`` sets it). Settings (``--custom-config-path``,
YAML, all optional): ``max_tool_calls`` (2), ``turn_tokens`` (model tokens per turn, 48),
``sandbox_urls`` (sandbox servers, ``slime-async sandbox-server``; empty: run code in this
process's own sandbox), ``sandbox_api_key``, ``sandbox_timeout_s`` (5), ``sandbox_concurrency`` (4).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import task


@dataclass(frozen=True)
class AgentSettings:
    max_tool_calls: int = 2
    turn_tokens: int = 48
    sandbox_urls: tuple[str, ...] = ()
    sandbox_api_key: str | None = None
    sandbox_timeout_s: float = 5.0
    sandbox_concurrency: int = 4


@functools.lru_cache(maxsize=8)
def agent_settings(path: str | None) -> AgentSettings:
    """The settings in ``path`` (YAML), read once per file; an unknown key is named."""
    if not path:
        return AgentSettings()
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    known = {f.name for f in dataclasses.fields(AgentSettings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown code-interpreter setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    if "sandbox_urls" in data:
        data["sandbox_urls"] = tuple(data["sandbox_urls"] or ())
    return AgentSettings(**data)


# One sandbox per process and settings, made on first use. The hook is a plain function called
# for every sample, and the pool's concurrency bound only means something if all samples share
# one; a cache keyed by the (frozen) settings gives that without a mutable global, builds nothing
# at import time (the sandbox needs the running event loop), and gives a run with other settings
# its own pool.
@functools.lru_cache(maxsize=4)
def shared_sandbox(settings: AgentSettings):
    from slime_async.sandbox import RemoteSandbox, Sandbox, SandboxLimits

    if settings.sandbox_urls:
        return RemoteSandbox(list(settings.sandbox_urls), api_key=settings.sandbox_api_key)
    return Sandbox(SandboxLimits(timeout_s=settings.sandbox_timeout_s), max_concurrency=settings.sandbox_concurrency)


async def generate(ctx: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    settings = agent_settings(ctx.config.custom_config_path)
    budget = sampling_params["max_new_tokens"]  # model tokens over all turns
    calls: list[dict[str, Any]] = []
    turns = 0
    answered = False  # the last turn ended by itself (EOS) without a code block
    while budget > 0:
        may_call = len(calls) < settings.max_tool_calls
        start = sample.response_length
        finish = await ctx.generate_turn(sample, sampling_params, max_new_tokens=min(budget, settings.turn_tokens),
                                         stop=[task.CODE_CLOSE] if may_call else [])
        turns += 1
        turn_ids = sample.response_tokens[start:]
        budget -= len(turn_ids)
        code = None
        if may_call and finish == "stop":
            code = task.extract_code(ctx.tokenizer.decode(turn_ids, skip_special_tokens=True))
        if code is None:
            answered = finish == "stop"  # the final answer, unless the turn ran out of tokens
            break
        result = await shared_sandbox(settings).run(code, timeout_s=settings.sandbox_timeout_s)
        shown = task.observation(result.stdout, result.stderr, result.exit_code, result.killed_reason)
        sample.append_observation(ctx.tokenizer(shown, add_special_tokens=False)["input_ids"])
        calls.append({"code": code, "output": shown, "exit_code": result.exit_code,
                      "killed_reason": result.killed_reason})
    sample.metadata["tool_calls"] = calls
    sample.metadata["metrics"] = {
        "tool_calls": len(calls),
        "tool_errors": sum(c["exit_code"] != 0 or c["killed_reason"] is not None for c in calls),
        "turns": turns,
    }
    sample.status = sample.Status.COMPLETED if answered else sample.Status.TRUNCATED
    return sample


async def reward(ctx: Any, sample: Any) -> float:
    return task.grade(sample.response, str(sample.label))
