"""What slime's entry points need from the running system, handed in by the rollout's adapter.

slime reaches its tokenizer and reward functions through process-wide singletons; here the
adapter puts a ``CompatServices`` on the ``args`` it builds, so the compat modules stay free of
components and of global state. A plug-in unit-tested with a plain ``argparse.Namespace`` has
no services: the entry points then fall back where they can (loading the tokenizer from
``args.hf_checkpoint``) and say what is missing where they cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slime_async.compat.slime.args import SERVICES_ATTR


@dataclass(frozen=True)
class CompatServices:
    tokenizer: Any
    # (rm_type, response_text, label) -> float: the built-in rule-based rewards (--rm-type).
    builtin_reward: Callable[[str, str, Any], float]


def services_of(args: Any) -> CompatServices | None:
    return getattr(args, SERVICES_ATTR, None)
