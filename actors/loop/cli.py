"""The ``slime-async`` command.

``train`` runs the RL job; ``serve-engine``, ``router``, ``sandbox-server``, ``convert`` and ``agent``
hand their arguments to the module that owns them, so each keeps its own ``--help``.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable

from actors.loop.console_noise import quiet_python_warnings, quiet_torch_cpp_warnings
from slime_async.config.flags import ConfigError


def _serve_engine(argv: list[str]) -> int:
    from actors.engine.cpu.config import parse_args

    # --help and a bad flag or model directory answer before the server imports torch and transformers.
    try:
        parse_args(argv).validate()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from actors.engine.cpu.server import main

    return main(argv)


def _convert(argv: list[str]) -> int:
    from actors.trainer.convert import main

    return main(argv)


def _router(argv: list[str]) -> int:
    from actors.router.standalone import main

    return main(argv)


def _sandbox_server(argv: list[str]) -> int:
    from slime_async.sandbox.server import main

    return main(argv)


def _agent(argv: list[str]) -> int:
    from slime_async.cluster.agent import main

    return main(argv)


def _prepare_reasoning_gym(argv: list[str]) -> int:
    from actors.rollout.reasoning_gym import main

    return main(argv)


def _prepare_verifiers(argv: list[str]) -> int:
    from actors.rollout.verifiers_env import main

    return main(argv)


def _train(argv: list[str]) -> int:
    quiet_python_warnings()
    # Light imports until the flags are parsed: `--help` needs neither torch nor megatron-core (a full
    # parse and --help-all import megatron-core's configs); the launcher loads once the config is good.
    from slime_async.config.loader import preflight
    from actors.loop.run_config import parse_run_config

    try:
        with quiet_torch_cpp_warnings():  # torch loads here, with megatron-core's configs
            config = parse_run_config(argv)
            preflight(config)  # paths and hooks: every config error fails here, before anything starts
    except ConfigError as error:
        print(f"slime-async train: error: {error}", file=sys.stderr)
        return 2
    from actors.loop.launch import run_train

    return run_train(config)


COMMANDS: dict[str, tuple[Callable[[list[str]], int], str]] = {
    "train": (_train, "run RL training (sync, one-step-off or fully-async)"),
    "serve-engine": (_serve_engine, "serve the embedded CPU engine (SGLang's HTTP API) for an HF model dir"),
    "router": (_router, "serve the router's HTTP front (SGLang /generate, OpenAI API) over running engines"),
    "sandbox-server": (_sandbox_server, "serve a sandbox for model-written code (POST /run) on this machine"),
    "convert": (_convert, "convert checkpoints: hf-to-megatron, megatron-to-hf"),
    "prepare-reasoning-gym": (_prepare_reasoning_gym, "write train/held-out JSONL from a reasoning-gym generator "
                              "(for --rm-type reasoning_gym)"),
    "prepare-verifiers": (_prepare_verifiers, "write train/held-out JSONL from a verifiers environment's datasets "
                          "(for actors.rollout.verifiers_env's hooks)"),
    "agent": (_agent, "run process children on this node for a head on another (multi-node runs: --head HOST:PORT)"),
}


def top_level_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slime-async",
        description="Fully-async RL post-training for LLMs: Megatron-core trainer ranks and SGLang "
        "(or embedded CPU) engines in one supervised asyncio process tree.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "`slime-async train --help` lists the project's flags, grouped by section (cluster, rollout,\n"
            "  algorithm, buffer, train, trainer, critic, engine, router, monitor, checkpoint), and how to\n"
            "  pass megatron-core's and SGLang's own options through; `slime-async train --help-all` lists\n"
            "  every flag, megatron-core's TransformerConfig / OptimizerConfig / DistributedDataParallelConfig\n"
            "  fields included. `slime-async COMMAND --help` for the other commands."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        top_level_parser().print_help()
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        top_level_parser().error(f"unknown command {command!r}; choose from {', '.join(COMMANDS)}")
    try:
        return COMMANDS[command][0](rest)
    finally:
        # Interpreter teardown garbage-collects everything torch, megatron and transformers made:
        # seconds on a busy machine after a SIGTERM already stopped the tree. The OS frees it anyway.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
