"""Keep third-party noise off the supervisor's console, where a user reads the run's own lines.

Each entry is a message the supervisor process cannot act on: it imports megatron-core only for
its config classes (the Transformer-Engine/Apex fallback warnings belong to the trainer ranks,
which still log them in their own files), uses torch.distributed only to hand weights over, and
runs math-verify where its signal-based timeout cannot work (rewards run in threads, with
``--reward-timeout`` instead). Child processes are not affected.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_IGNORED_WARNINGS = (
    "Transformer Engine and Apex are not installed",  # megatron-core on import, on every CPU host
    "You are using a Backend .* as a ProcessGroup",  # torch.distributed's gloo deprecation, per collective
)
_QUIET_LOGGERS = ("math_verify",)  # "Timeout is disabled as parsing_timeout is None", per parse
# HTTP clients an agent hook uses in this process (the openai client is built on httpx, in openai 3
# on httpx2): "HTTP Request: POST .../chat/completions 200" at INFO, once per turn of every episode.
_CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai")


def quiet_python_warnings() -> None:
    """Filter the warnings and loggers above in this process (cheap: imports nothing)."""
    for message in _IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in _CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


@contextmanager
def quiet_torch_cpp_warnings() -> Iterator[None]:
    """torch's C++ warnings (``[W... tensorpipe_agent.cpp] ... pipe closed`` when a trainer rank
    exits before the supervisor's RPC agent) at error level for this process: c10 reads
    ``TORCH_CPP_LOG_LEVEL`` once, when torch loads, so torch is imported inside; the variable
    is removed again so that child processes (trainer ranks, engines) keep their warnings."""
    if "TORCH_CPP_LOG_LEVEL" in os.environ:  # the user's choice stands
        yield
        return
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
        import torch  # noqa: F401 - loaded now if the block did not: the level is read at load
    finally:
        del os.environ["TORCH_CPP_LOG_LEVEL"]
