"""``slime.utils.misc.load_function``: import ``package.module.function`` (or ``package.module:function``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_function(path: str) -> Callable[..., Any]:
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"expected package.module.function, got {path!r}")
    return getattr(importlib.import_module(module_name), attr)
