"""prime-rl's ``verifiers`` environments, run unchanged against the router's HTTP front.

A verifiers environment (the ``verifiers`` extra, ``verifiers==0.3.1``: its classic API,
``vf.SingleTurnEnv`` / ``vf.ToolEnv`` / ``vf.MultiTurnEnv``, ``vf.Rubric``, ``vf.Parser``, a module
with ``load_environment(**kwargs)``) trains here as its author wrote it:

- ``slime-async prepare-verifiers`` (``main``) writes the env's ``dataset`` and ``eval_dataset`` as
  prompt rows: ``{"prompt": [messages], "label": answer, "metadata": {"verifiers": {"input": row}}}``,
  ``row`` being the env's own rollout input (prompt, answer, info, task, example_id).
- ``generate`` (``--custom-generate-function-path actors.rollout.verifiers_env:generate``) runs the
  env's own ``rollout`` (its turns, tools, stop conditions) with a verifiers
  ``OpenAIChatCompletionsClient`` on the sample's base URL (``ctx.openai_base_url``), so the front
  records every request token by token, and returns ``ctx.collect_trajectory(sample)``.
- ``reward`` (``--custom-rm-path actors.rollout.verifiers_env:reward --group-rm``) is the env's
  rubric: ``rubric.score_group`` over the group's rollouts, as verifiers scores a group (group
  reward functions see the whole group; an evaluation sample is a group of one). The rubric's
  metrics (its reward functions and monitors: ``num_turns``, ``total_tool_calls``, ...) become
  ``rollout/<name>`` and ``eval/<name>``.

Settings (``--custom-config-path``, YAML): ``env_id`` (required: the module that has
``load_environment``, as ``vf.load_environment`` imports it: an installed env package or a dotted
path), ``env_args`` (its keyword arguments), ``model`` (the name sent, default ``policy``) and
``max_tokens`` (``max_tokens`` of each request; default: the sample's whole token budget).

The env runs on its own event loop in a thread of the rollout process: its tools and reward
functions may block (verifiers calls sync tools inline), and they must not stall the supervisor.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from actors.rollout.generate import TRAJECTORY_SESSION
from slime_async.generation import GenerationFailed

log = logging.getLogger(__name__)

METADATA_KEY = "verifiers"  # sample.metadata key: {"input": the env's rollout input, "rollout": id}
CONNECT_TIMEOUT_S = 60.0  # of each request to the front (see _rollout)
MAX_PENDING = 4096  # rolled-out states awaiting their rubric (a failed group's are evicted oldest first)
SETTINGS = ("env_id", "env_args", "model", "max_tokens")


def require_verifiers() -> Any:
    """The verifiers package (its classic API), or ValueError in one line saying how to install it."""
    try:
        import verifiers as vf

        vf.SingleTurnEnv  # noqa: B018 - 0.4.0 dropped the classic API: fail here, not mid-run
    except (ImportError, AttributeError):
        raise ValueError("verifiers (the classic API) is not installed: pip install 'slime-async[verifiers]' "
                         "(or verifiers==0.3.1)") from None
    return vf


@dataclass(frozen=True)
class Settings:
    env_id: str
    env_args: dict[str, Any] = field(default_factory=dict)
    model: str = "policy"
    max_tokens: int | None = None


@functools.lru_cache(maxsize=8)
def settings(path: str | None) -> Settings:
    """The settings in ``path`` (YAML), read once per file; a missing or bad key is named."""
    if not path:
        raise ValueError("the verifiers hooks need --custom-config-path: a YAML file with env_id (and env_args)")
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping with env_id")
    unknown = sorted(set(data) - set(SETTINGS))
    if unknown:
        raise ValueError(f"{path}: unknown verifiers setting(s) {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    if not isinstance(data.get("env_id"), str) or not data["env_id"]:
        raise ValueError(f"{path}: env_id must name the environment module (the one with load_environment)")
    if not isinstance(data.get("env_args") or {}, dict):
        raise ValueError(f"{path}: env_args must be a mapping of load_environment's keyword arguments")
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
        raise ValueError(f"{path}: max_tokens must be a positive integer, got {max_tokens!r}")
    return Settings(env_id=data["env_id"], env_args=dict(data.get("env_args") or {}),
                    model=str(data.get("model", "policy")), max_tokens=max_tokens)


def uses_hooks(config: Any) -> bool:
    """Whether the rollout config names one of this module's hooks."""
    paths = (config.custom_generate_function_path, config.rollout_function_path, config.custom_rm_path)
    return any(path and path.replace(":", ".").startswith(__name__ + ".") for path in paths)


def preflight(config: Any) -> None:
    """At start, before anything is spawned: the settings are good, verifiers is installed and the env
    module imports and has ``load_environment`` (ValueError naming what is wrong)."""
    found = settings(config.custom_config_path)
    require_verifiers()
    from verifiers.utils.env_utils import import_env_module

    try:
        module = import_env_module(found.env_id)
    except ImportError as error:
        raise ValueError(f"verifiers env_id {found.env_id!r} does not import: {error}") from None
    if not callable(getattr(module, "load_environment", None)):
        raise ValueError(f"verifiers env_id {found.env_id!r}: {module.__name__} has no load_environment()")


_envs: dict[tuple[str, str], Any] = {}
_envs_lock = threading.Lock()


def load_env(env_id: str, env_args: dict[str, Any]) -> Any:
    """``vf.load_environment(env_id, **env_args)``, once per process and arguments."""
    key = (env_id, json.dumps(env_args, sort_keys=True))
    with _envs_lock:
        if key not in _envs:
            vf = require_verifiers()
            import datasets

            datasets.disable_progress_bars()  # load_environment's dataset.map calls: bars on the run's console
            try:
                _envs[key] = vf.load_environment(env_id, **env_args)
            except (ValueError, RuntimeError) as error:  # verifiers wraps import and load errors
                cause = error.__cause__
                raise ValueError(f"verifiers env {env_id!r}: {error}" + (f" ({cause})" if cause else "")) from None
        return _envs[key]


class EnvLoop:
    """An event loop on a daemon thread: the verifiers envs' rollouts and rubrics run there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="verifiers-env", daemon=True).start()

    async def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` on the env loop and await it from the caller's loop (cancelling the
        caller's task cancels it there too)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self.loop))


_loop: EnvLoop | None = None
_loop_lock = threading.Lock()


def env_loop() -> EnvLoop:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = EnvLoop()
        return _loop


# Rolled-out states between the generate hook and the group reward (the rubric scores them
# together); keyed by the id in the samples' metadata, so nothing unserialisable rides on a Sample.
_pending: OrderedDict[str, Any] = OrderedDict()
_pending_lock = threading.Lock()


def _keep(state: Any) -> str:
    key = uuid.uuid4().hex
    with _pending_lock:
        _pending[key] = state
        while len(_pending) > MAX_PENDING:
            _pending.popitem(last=False)
    return key


def _take(key: str) -> Any:
    with _pending_lock:
        state = _pending.pop(key, None)
    if state is None:
        raise ValueError(f"verifiers rollout {key} is unknown (evicted, or scored already)")
    return state


def sampling_args(params: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """The run's sampling parameters as verifiers passes them to the client (``max_tokens`` per request)."""
    args: dict[str, Any] = {"temperature": params["temperature"], "top_p": params["top_p"],
                            "max_tokens": min(max_tokens or params["max_new_tokens"], params["max_new_tokens"])}
    top_k = params.get("top_k", -1)
    args["extra_body"] = {"top_k": top_k} if top_k not in (None, -1) else {}
    return args


async def _rollout(env: Any, row: dict[str, Any], base_url: str, api_key: str, model: str,
                   args: dict[str, Any]) -> Any:
    """The env's own rollout over a verifiers client on ``base_url`` (runs on the env loop)."""
    import openai

    vf = require_verifiers()
    # The front is on 127.0.0.1, but on a saturated machine its accept can take longer than the
    # client's 5 s connect timeout (measured: load 40, a fully-async run lost whole groups to
    # ConnectTimeout); the read timeout stays the client's default.
    timeout = openai.Timeout(600.0, connect=CONNECT_TIMEOUT_S)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout) as native:
        return await env.rollout(row, vf.OpenAIChatCompletionsClient(native), model, args)


async def generate(ctx: Any, sample: Any, sampling_params: dict[str, Any]) -> list[Any]:
    """One rollout of the env for ``sample``'s row, captured token-exactly by the front."""
    config = settings(ctx.config.custom_config_path)
    env = load_env(config.env_id, config.env_args)
    row = (sample.metadata.get(METADATA_KEY) or {}).get("input")
    if not isinstance(row, dict):
        raise ValueError(f"sample has no metadata.{METADATA_KEY}.input: write the prompts with "
                         "slime-async prepare-verifiers")
    base_url = ctx.openai_base_url(sample)
    state = await env_loop().run(_rollout(env, row, base_url, ctx.router_api_key or "unused", config.model,
                                          sampling_args(sampling_params, config.max_tokens)))
    error = state.get("error")
    if error is not None and not state.get("trajectory"):
        # No turn was recorded: verifiers turned the failure into state["error"]; say what it was.
        ctx.router.tell("end_session", ctx.trajectory_session(sample))
        sample.metadata.pop(TRAJECTORY_SESSION, None)
        raise GenerationFailed(f"verifiers env {config.env_id}: the rollout made no model turn: {_chain(error)}")
    pieces = await ctx.collect_trajectory(sample)
    key = _keep(state)
    turns = len(state.get("trajectory") or [])
    for piece in pieces:
        piece.metadata[METADATA_KEY] = {**piece.metadata.get(METADATA_KEY, {}), "rollout": key}
    pieces[-1].metadata["metrics"] = {"turns": turns, "env_errors": float(state.get("error") is not None)}
    return pieces


def _chain(error: BaseException) -> str:
    """``error`` and its causes in one line (verifiers wraps client errors in ModelError)."""
    parts = []
    while error is not None and len(parts) < 4:
        parts.append(f"{type(error).__name__}({str(error)[:200]})" if str(error) else type(error).__name__)
        error = error.__cause__
    return " <- ".join(parts)


async def _score(env: Any, states: list[Any]) -> None:
    """The env's rubric over a group, as verifiers' own group runs score it (runs on the env loop)."""
    if env.score_rollouts:
        await env.rubric.score_group(states)
    else:
        await env.rubric.dummy_score_group(states)
    for state in states:
        await env.rubric.cleanup(state)


async def reward(ctx: Any, samples: list[Any]) -> list[float]:
    """The env's rubric rewards of a group's samples (``--group-rm``); a rollout split into several
    pieces gives each the rollout's reward."""
    config = settings(ctx.config.custom_config_path)
    env = load_env(config.env_id, config.env_args)
    keys = [(s.metadata.get(METADATA_KEY) or {}).get("rollout") for s in samples]
    if None in keys:
        raise ValueError("a sample was not generated by actors.rollout.verifiers_env:generate")
    unique = list(dict.fromkeys(keys))
    states = [_take(key) for key in unique]
    await env_loop().run(_score(env, states))
    by_key = dict(zip(unique, states))
    for sample, key in zip(samples, keys):
        metrics = {name: float(value) for name, value in (by_key[key].get("metrics") or {}).items()
                   if isinstance(value, (int, float))}
        sample.metadata["metrics"] = {**sample.metadata.get("metrics", {}), **metrics}
    return [float(by_key[key]["reward"]) for key in keys]


def rows(env: Any, split: str) -> list[dict[str, Any]]:
    """The env's ``split`` dataset (train or eval) as prompt rows (see the module docstring)."""
    dataset = env.get_dataset() if split == "train" else env.get_eval_dataset()
    out = []
    for index, record in enumerate(dataset):
        row = {key: _plain(value) for key, value in record.items()}
        prompt = row.get("prompt")
        if not isinstance(prompt, list) or not prompt:
            raise ValueError(f"verifiers {split} row {index}: prompt must be a list of chat messages, got {prompt!r}")
        try:
            json.dumps(row)
        except (TypeError, ValueError) as error:
            raise ValueError(f"verifiers {split} row {index} is not JSON-serialisable ({error})") from None
        out.append({"prompt": prompt, "label": str(row.get("answer", "")), "metadata": {METADATA_KEY: {"input": row}}})
    return out


def _plain(value: Any) -> Any:
    """A dataset value without the None fields Arrow adds to every message of a column."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slime-async prepare-verifiers", description=(
        "Write a verifiers environment's dataset (train.jsonl) and eval dataset (heldout.jsonl) as prompt rows "
        "for actors.rollout.verifiers_env's hooks."))
    parser.add_argument("--config", required=True, help="the hooks' settings (YAML: env_id, env_args)")
    parser.add_argument("--out", required=True, type=Path, help="directory for train.jsonl and heldout.jsonl")
    args = parser.parse_args(argv)
    try:
        config = settings(args.config)
        env = load_env(config.env_id, config.env_args)
        splits = {"train.jsonl": rows(env, "train"), "heldout.jsonl": rows(env, "eval")}
    except (ValueError, OSError) as error:
        print(f"prepare-verifiers: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in splits.items():
        with open(args.out / name, "w") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in records)
    print(f"wrote {len(splits['train.jsonl'])} training and {len(splits['heldout.jsonl'])} held-out rows of "
          f"{config.env_id} to {args.out}")
    return 0
