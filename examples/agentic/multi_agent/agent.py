"""Solver -> critic -> revision, all played by the policy: the multi-agent example's generate hook
and reward.

One Sample holds the three turns, with the role prompts between them as observations (loss mask
0): every role reads the whole exchange before it, so the exchange is one token sequence the
engine's prefix cache serves turn after turn, and the reward on the final answer trains all three
turns at once (the critic and the first answer are credited through it), in groups of the usual
size. One Sample per role (slime's multi-agent example) would need each role's tokens re-fed as
another sample's prompt and a reward for each.

The solver's first turn is sampled at ``solver_temperature`` (1.0) even in evaluation, so it is
noisy and the critic has something to catch; the critic and the revision use the run's sampling
(greedy in evaluation). Per-sample metrics: ``first_correct``, ``critic_no`` (the critic said
"no"), ``final_correct``, ``changed`` (the revision differs from the first answer), ``turns``.

Plain-text prompts end each turn at a newline; chat prompts (lists of messages, for a tokenizer
with a chat template) end each turn at the model's EOS and get the role prompts as user turns
rendered by the template. Optional settings (``--custom-config-path`` YAML): ``solver_temperature``,
``turn_tokens`` (8).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from . import task

_MARK = "\u2063MARK\u2063"  # an assistant message no template rewrites: where the next user turn starts


@functools.lru_cache(maxsize=4)
def _settings(path: str | None) -> dict[str, Any]:
    import yaml

    data = (yaml.safe_load(Path(path).read_text()) or {}) if path else {}
    return {"solver_temperature": 1.0, "turn_tokens": 8, **data}


def role_prompt(tokenizer: Any, text: str, chat: bool, ended_with: str = "") -> str:
    """What is appended before a role's turn: its line, or a user turn rendered by the chat template
    (what follows an assistant message's content up to the next assistant turn's start), less
    ``ended_with``, the end-of-turn token the model already wrote."""
    if not chat:
        return text + "\n"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK},
                {"role": "user", "content": text}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    rest = rendered[rendered.index(_MARK) + len(_MARK):]
    return rest[len(ended_with):] if ended_with and rest.startswith(ended_with) else rest


def turn_end(tokenizer: Any, rendered_role_prompt: str) -> str:
    """The special token a rendered role prompt starts with (ChatML's ``<|im_end|>``): the end of
    the model's turn, which the model itself writes; "" when there is none."""
    for token in sorted(tokenizer.all_special_tokens, key=len, reverse=True):
        if rendered_role_prompt.startswith(token):
            return token
    return ""


async def generate(ctx, sample, sampling_params):
    settings = _settings(ctx.config.custom_config_path)
    chat = isinstance(sample.prompt, list)
    turns: list[str] = []
    for role in (None, task.CRITIC_PROMPT, task.REVISE_PROMPT):
        params = sampling_params
        if role is None:
            params = {**sampling_params, "temperature": settings["solver_temperature"]}
        else:
            ended_with = ctx.tokenizer.decode(sample.tokens[-1:]) if chat else ""
            text = role_prompt(ctx.tokenizer, role, chat, ended_with)
            sample.append_observation(ctx.tokenizer(text, add_special_tokens=False)["input_ids"])
        start = sample.response_length
        await ctx.generate_turn(sample, params, max_new_tokens=settings["turn_tokens"], stop=() if chat else ("\n",))
        new = sample.tokens[len(sample.tokens) - (sample.response_length - start):]
        turns.append(ctx.tokenizer.decode(new, skip_special_tokens=True))
    first, verdict, final = (task.first_word(t) for t in turns)
    label = str(sample.label)
    sample.metadata["final_answer"] = final
    sample.metadata["metrics"] = {"first_correct": float(first == label), "critic_no": float(verdict == "no"),
                                  "final_correct": float(final == label), "changed": float(final != first),
                                  "turns": float(len(turns))}  # the agent examples' common column
    sample.status = sample.Status.COMPLETED
    return sample


async def reward(ctx, sample) -> float:
    return float(sample.metadata.get("final_answer") == str(sample.label))
