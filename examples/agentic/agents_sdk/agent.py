"""The code-interpreter task as an OpenAI Agents SDK agent (``openai-agents``), trained unchanged
through the router front's trajectory capture.

The agent is written as an Agents SDK user writes it (``build_agent``): an ``Agent`` with
``instructions``, one ``@function_tool`` (``run_python``) and a model, run by ``Runner.run``. The
generate hook only hands the SDK's model an ``AsyncOpenAI`` client on the sample's base URL
(``ctx.openai_base_url(sample)``: every request is recorded token by token) and returns
``ctx.collect_trajectory(sample)``: the model's tokens trainable with the engine's logprobs, the
template glue and the tool's output loss mask 0. The reward grades the run's ``final_output``.

The model path is the ``model_api`` setting: ``chat_completions`` (``OpenAIChatCompletionsModel``,
POST /v1/chat/completions) or ``responses`` (``OpenAIResponsesModel``, POST /v1/responses).
Tracing is off (``RunConfig(tracing_disabled=True)`` and ``set_tracing_disabled``): nothing is
sent anywhere but the front.

Settings (``--custom-config-path``, YAML, all optional): ``model_api`` plus the code-interpreter
hook's keys (``max_tool_calls``, ``turn_tokens`` = ``max_tokens`` of each model call, the
sandbox's). The SDK has no token budget over turns: an episode is at most ``max_tool_calls + 1``
model calls (``max_turns``) of ``turn_tokens`` each.
Hook paths: ``examples.agentic.agents_sdk.agent:generate`` and ``...agent:reward``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from agents import (Agent, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, OpenAIChatCompletionsModel,
                    OpenAIResponsesModel, RunConfig, RunContextWrapper, Runner, function_tool, set_tracing_disabled)

from examples.agentic.code_interpreter import task
from examples.agentic.code_interpreter.agent import AgentSettings, shared_sandbox
from examples.agentic.openai_agent.agent import tool_output
from slime_async.sample import Status

MODEL_APIS = ("chat_completions", "responses")
INSTRUCTIONS = "Use run_python to compute."  # the SDK sends it as the system (or instructions) turn
FINAL_OUTPUT = "final_output"  # sample.metadata key: the agent's final answer (what reward grades)
# The front is local, but on a loaded machine its event loop (shared with the rollout) can take
# longer than openai's 5 s connect timeout to accept: measured at load ~45, the step-0 evaluation
# failed with APITimeoutError. Waiting for the local front is right; the read limit stays 600 s.
CLIENT_TIMEOUT = openai.Timeout(600.0, connect=120.0)


@dataclass(frozen=True)
class SdkSettings:
    model_api: str = "chat_completions"
    agent: AgentSettings = AgentSettings()


@functools.lru_cache(maxsize=8)
def sdk_settings(path: str | None) -> SdkSettings:
    """The settings in ``path`` (YAML), read once per file; a bad key or value is named."""
    if not path:
        return SdkSettings()
    import yaml

    data = yaml.safe_load(Path(path).read_text()) or {}
    model_api = data.pop("model_api", "chat_completions")
    if model_api not in MODEL_APIS:
        raise ValueError(f"{path}: model_api must be one of {', '.join(MODEL_APIS)}, got {model_api!r}")
    known = {f.name for f in dataclasses.fields(AgentSettings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown agents_sdk setting(s) {', '.join(unknown)} "
                         f"(known: model_api, {', '.join(sorted(known))})")
    if "sandbox_urls" in data:
        data["sandbox_urls"] = tuple(data["sandbox_urls"] or ())
    return SdkSettings(model_api=model_api, agent=AgentSettings(**data))


@dataclass
class Episode:
    """The run's context object (``RunContextWrapper.context``): what the tool needs and records."""

    settings: AgentSettings
    calls: list[dict[str, Any]] = field(default_factory=list)


@function_tool
async def run_python(wrapper: RunContextWrapper[Episode], code: str) -> str:
    """Run Python code and return what it prints.

    Args:
        code: the Python program.
    """
    episode = wrapper.context
    if len(episode.calls) >= episode.settings.max_tool_calls:
        return "error: no tool calls left"
    result = await shared_sandbox(episode.settings).run(code, timeout_s=episode.settings.sandbox_timeout_s)
    content = tool_output(result.stdout, result.stderr, result.exit_code, result.killed_reason)
    episode.calls.append({"code": code, "output": content, "exit_code": result.exit_code,
                          "killed_reason": result.killed_reason})
    return content


def build_agent(model: Any, model_settings: ModelSettings) -> Agent[Episode]:
    """The agent, as its author wrote it: instructions, a function tool and a model."""
    return Agent(name="calculator", instructions=INSTRUCTIONS, tools=[run_python], model=model,
                 model_settings=model_settings)


def sdk_model(model_api: str, client: Any) -> Any:
    """The SDK's model for ``model_api`` over ``client``."""
    if model_api == "responses":
        return OpenAIResponsesModel(model="policy", openai_client=client)
    return OpenAIChatCompletionsModel(model="policy", openai_client=client)


async def generate(ctx: Any, sample: Any, sampling_params: dict[str, Any]) -> list[Any]:
    set_tracing_disabled(True)  # the SDK's default exporter would post traces to api.openai.com
    settings = sdk_settings(ctx.config.custom_config_path)
    model_settings = ModelSettings(temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                                   max_tokens=settings.agent.turn_tokens,
                                   extra_body={"top_k": sampling_params["top_k"]})
    episode = Episode(settings.agent)
    final_output, turns, incomplete = None, settings.agent.max_tool_calls + 1, None
    async with openai.AsyncOpenAI(base_url=ctx.openai_base_url(sample), api_key=ctx.router_api_key or "unused",
                                  max_retries=0, timeout=CLIENT_TIMEOUT) as client:
        agent = build_agent(sdk_model(settings.model_api, client), model_settings)
        try:
            result = await Runner.run(agent, sample.prompt, context=episode,
                                      max_turns=settings.agent.max_tool_calls + 1,
                                      run_config=RunConfig(tracing_disabled=True))
            final_output, turns = result.final_output, len(result.raw_responses)
        except MaxTurnsExceeded:
            pass  # still calling tools when out of turns: no answer (reward 0), the turns still train
        except ModelBehaviorError as error:
            # The Responses model raises on a response whose status is "incomplete" (the turn ran
            # out of max_output_tokens); checked against the recording below.
            incomplete = error
    pieces = await ctx.collect_trajectory(sample)
    last = pieces[-1]  # per episode, on the piece the final answer ends
    if incomplete is not None:
        if last.status is not Status.TRUNCATED:
            raise incomplete  # the model misbehaved some other way: not a budget cut, the sample fails
        # A budget cut is a truncated sample like any other: no answer (reward 0), its tokens train.
        turns = len(episode.calls) + 1  # each tool call's turn, then the one that was cut
    last.metadata[FINAL_OUTPUT] = final_output
    last.metadata["tool_calls"] = episode.calls
    last.metadata["metrics"] = {
        "tool_calls": len(episode.calls),
        "tool_errors": sum(c["exit_code"] != 0 or c["killed_reason"] is not None for c in episode.calls),
        "turns": turns,
        "incomplete": float(incomplete is not None),
    }
    return pieces


async def reward(ctx: Any, sample: Any) -> float:
    answer = sample.metadata.get(FINAL_OUTPUT)
    return task.grade(answer, str(sample.label)) if isinstance(answer, str) else 0.0
