"""Loading user hooks given as ``package.module:function``."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """Import ``package.module:function``; errors name the flag and what is wrong."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag}: expected package.module:function, got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{flag}: cannot import module {module_name!r}: {error}") from None
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        raise ValueError(f"{flag}: module {module_name!r} has no function {attr!r}")
    return function
