"""Loading user hooks, and telling slime-style hooks from native ones.

A hook path is ``package.module:function`` or, as slime writes it, ``package.module.function``.

Style: a hook whose first parameter is named ``args`` is slime-style (slime's signatures:
``generate(args, sample, sampling_params)``, ``rm(args, sample)``, ``filter(args, samples)``) and
runs through ``actors.rollout.slime_plugins``; one whose first parameter is ``ctx`` is native.
A first parameter with another name counts as slime-style when the hook's module imports
``slime_async.compat.slime`` (the import swap), native otherwise; a filter with a single
parameter is native (``fn(rewards)``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, Literal

from slime_async.exception_text import describe

HookStyle = Literal["native", "slime"]
COMPAT_PACKAGE = "slime_async.compat.slime"


def split_function_path(path: str) -> tuple[str, str]:
    """``("package.module", "function")`` from either spelling; ValueError when neither."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr or "." in attr or ":" in attr:
        raise ValueError(f"expected package.module:function or package.module.function, got {path!r}")
    if "/" in module_name or "\\" in module_name or module_name.endswith(".py"):
        stem = module_name.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise ValueError(f"{path!r} names a file; name the module as Python imports it ({stem}:{attr}, with its "
                         "directory on PYTHONPATH)")
    return module_name, attr


def load_function(path: str, flag: str) -> Callable[..., Any]:
    """Import the hook at ``path``; errors are one line naming the flag, the hook and what is
    wrong (for a module that raises on import: its exception and where, in the user's file)."""
    try:
        module_name, attr = split_function_path(path)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        hint = ""
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            # The hook's own module (or its package) is not on sys.path; a console script, unlike
            # `python -m`, does not put the current directory there.
            hint = " (hooks import from sys.path: add the directory that holds it to PYTHONPATH)"
        raise ValueError(f"{flag} {path}: cannot import module {module_name!r}: {error}{hint}") from None
    except Exception as error:  # noqa: BLE001 - the module itself is broken (SyntaxError, NameError, ...)
        raise ValueError(f"{flag} {path}: importing module {module_name!r} failed: {describe(error)}") from None
    function = getattr(module, attr, None)
    if function is None or not callable(function):
        raise ValueError(f"{flag} {path}: module {module_name!r} has no function {attr!r}")
    return function


def hook_style(function: Callable[..., Any]) -> HookStyle:
    """Whether ``function`` is written against slime's signatures or the native ones."""
    parameters = _positional_parameters(function)
    first = parameters[0] if parameters else None
    if first == "args":
        return "slime"
    if first == "ctx" or not parameters:
        return "native"
    return "slime" if _imports_compat(function) else "native"


def is_native_filter(function: Callable[..., Any]) -> bool:
    """Whether a dynamic-sampling filter is called as ``fn(rewards)`` (one parameter, or a native
    style) rather than as slime's ``fn(args, samples)``."""
    return len(_positional_parameters(function)) == 1 or hook_style(function) == "native"


def parameter_names(function: Callable[..., Any]) -> list[str]:
    """The positional parameter names of ``function`` (empty when it cannot be inspected)."""
    return _positional_parameters(function)


def _positional_parameters(function: Callable[..., Any]) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in signature.parameters.values() if p.kind in kinds]


def _imports_compat(function: Callable[..., Any]) -> bool:
    # The source, not the module's globals: ``Sample`` imported through the compat path is the
    # runtime's own class, whose __module__ does not name the compat package.
    module = inspect.getmodule(function)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return False
    return COMPAT_PACKAGE in source


def accepts_positional(function: Callable[..., Any], n: int) -> bool:
    """Whether ``function`` can be called with ``n`` positional arguments (and no others)."""
    try:
        inspect.signature(function).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        return True
    return True


def check_hook(path: str, flag: str, calls: tuple[int, ...], shape: str) -> Callable[..., Any]:
    """Import the hook at ``path`` and check it takes one of ``calls`` positional arguments;
    ``shape`` is the signature the error shows. Errors name the flag."""
    function = load_function(path, flag)
    if not any(accepts_positional(function, n) for n in calls):
        try:
            signature = str(inspect.signature(function))
        except (TypeError, ValueError):
            signature = "(...)"
        raise ValueError(f"{flag} {path}: {getattr(function, '__name__', path)}{signature} does not take the "
                         f"arguments it will be called with: {shape}")
    return function
