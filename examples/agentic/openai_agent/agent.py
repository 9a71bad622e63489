"""The code-interpreter task as a plain ``openai``-client tool-calling agent, trained through the
router front's trajectory capture.

The agent is what one would write against any OpenAI-compatible server: chat completions with a
``run_python`` tool; each call's code runs in the sandbox and its output goes back as a ``tool``
message; the answer without a tool call ends the episode, and a call made with the token budget
spent is not run (no later turn would read its output). The training run hands the client a
per-sample base URL (``ctx.openai_base_url(sample)``), so every request is recorded token by
token, and ``ctx.collect_trajectory(sample)`` returns the turns as Samples: the model's tokens
trainable with the engine's logprobs, the template glue and the tool's output loss mask 0.

Settings are the code-interpreter hook's (``--custom-config-path``, the same YAML keys):
``max_tool_calls``, ``turn_tokens`` (``max_tokens`` of each request) and the sandbox's.
Hook paths: ``examples.agentic.openai_agent.agent:generate`` and ``...agent:reward``.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from examples.agentic.code_interpreter import task
from examples.agentic.code_interpreter.agent import agent_settings, shared_sandbox

TOOLS = [{"type": "function", "function": {
    "name": "run_python",
    "description": "Run Python code and return what it prints.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}]


def tool_output(stdout: str, stderr: str = "", exit_code: int | None = 0, killed_reason: str | None = None) -> str:
    """The ``tool`` message's content: the printed output, or the error's last line."""
    if exit_code != 0 or killed_reason:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        return (lines[-1] if lines else f"error: {killed_reason or f'exit code {exit_code}'}")[:task.OUTPUT_LIMIT]
    return stdout.strip()[:task.OUTPUT_LIMIT]


def code_of(call: Any) -> str | None:
    """The ``code`` argument of a ``run_python`` call, None for any other call."""
    if call.function.name != "run_python":
        return None
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError:
        return None
    code = arguments.get("code") if isinstance(arguments, dict) else None
    return code if isinstance(code, str) else None


async def generate(ctx: Any, sample: Any, sampling_params: dict[str, Any]) -> list[Any]:
    settings = agent_settings(ctx.config.custom_config_path)
    budget = sampling_params["max_new_tokens"]  # model tokens over all turns
    messages: list[dict[str, Any]] = [{"role": "user", "content": sample.prompt}]
    calls: list[dict[str, Any]] = []
    turns = 0
    async with openai.AsyncOpenAI(base_url=ctx.openai_base_url(sample), api_key=ctx.router_api_key or "unused",
                                  max_retries=0) as client:
        while budget > 0:
            answer = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=min(budget, settings.turn_tokens),
                temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                extra_body={"top_k": sampling_params["top_k"]})
            choice = answer.choices[0]
            turns += 1
            budget -= len(choice.token_ids)
            messages.append(choice.message.model_dump(exclude_none=True))
            if not choice.message.tool_calls or len(calls) >= settings.max_tool_calls or budget <= 0:
                break  # answered, out of calls, or no tokens left for a turn that would read the result
            for call in choice.message.tool_calls:
                code = code_of(call)
                if code is None:
                    content, exit_code, killed = f"error: unknown tool or bad arguments: {call.function.name}", 1, None
                else:
                    result = await shared_sandbox(settings).run(code, timeout_s=settings.sandbox_timeout_s)
                    content = tool_output(result.stdout, result.stderr, result.exit_code, result.killed_reason)
                    exit_code, killed = result.exit_code, result.killed_reason
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                calls.append({"code": code, "output": content, "exit_code": exit_code, "killed_reason": killed})
    pieces = await ctx.collect_trajectory(sample)
    # Per episode, on its last piece (the one the final answer is graded on).
    pieces[-1].metadata["tool_calls"] = calls
    pieces[-1].metadata["metrics"] = {
        "tool_calls": len(calls),
        "tool_errors": sum(c["exit_code"] != 0 or c["killed_reason"] is not None for c in calls),
        "turns": turns,
    }
    return pieces


async def reward(ctx: Any, sample: Any) -> float:
    return task.grade(sample.response, str(sample.label))


def conversation(problem: task.Problem) -> list[dict[str, Any]]:
    """The episode an ideal agent has for ``problem``, as chat messages (for the SFT traces).

    The code is ``print( 347*29+812)``: the space before the expression is the token that precedes
    it in the question (``What is 347*29+812?``), so writing its first digit is an induction copy
    (the token that followed the same token before). After a 150-step warm start (hidden 64)
    32 of 32 held-out calls were exact; with ``print(347*29+812)`` none of 8 were (near-constant
    expressions such as ``733-53+533``): the tool call's JSON puts ~25 tokens between the
    question and the code."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": f"print( {problem.expression})"})}}
    return [{"role": "user", "content": problem.question},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": str(problem.answer)},
            {"role": "assistant", "content": task.answer_turn(problem.answer)}]
