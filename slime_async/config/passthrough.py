"""Pass-through flags: SGLang's ``ServerArgs`` and megatron-core's config dataclasses.

We never wrap these options one by one. Megatron flags are generated from the installed
``TransformerConfig``, ``OptimizerConfig`` and ``DistributedDataParallelConfig``, so an option a
new megatron-core adds is usable the day it is installed. SGLang flags are accepted as
``--sglang-<field>`` and forwarded verbatim to ``sglang.launch_server``; when sglang is importable
their names and values are checked against its ``ServerArgs``, otherwise they go through raw
(sglang usually lives only on GPU hosts).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from typing import Any

from slime_async.config.flags import ConfigError, FieldFlag, convert_value, dataclass_flags, flag_type, suggest
from slime_async.config.megatron_table import megatron_table

SGLANG_PREFIX = "--sglang-"



@functools.cache
def megatron_flags(extra: tuple[type, ...] = ()) -> tuple[FieldFlag, ...]:
    """One flag per field of the three megatron-core configs (read from the cached table, so
    parsing imports no megatron-core) and of ``extra`` dataclasses (the trainer's LR schedule and
    Megatron-LM model flags, which the composition root names); a name shared by two, such as
    ``bf16``, is one flag that sets both."""
    flags: dict[str, FieldFlag] = {flag.field: flag for flag in megatron_table().flags}
    for cls in extra:
        for flag in dataclass_flags("megatron", cls):
            flags.setdefault(flag.field, dataclasses.replace(flag, help=f"[{cls.__name__}] {flag.help}".strip()))
    return tuple(flags.values())


def split_sglang_tokens(argv: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Separate ``--sglang-*`` flags (with their values) from the rest of ``argv``.

    A flag's values are the tokens up to the next ``--flag``; no value means a boolean switch.
    """
    rest: list[str] = []
    sglang: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith(SGLANG_PREFIX):
            rest.append(token)
            i += 1
            continue
        name, eq, inline = token[len(SGLANG_PREFIX):].partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(argv) and not argv[i].startswith("--"):
            values.append(argv[i])
            i += 1
        sglang.append((name.replace("-", "_"), values))
    return rest, sglang


@functools.cache
def _sglang_server_args() -> dict[str, Any] | None:
    try:
        from sglang.srt.server_args import ServerArgs
    except Exception:  # noqa: BLE001 - absent or broken sglang: forward raw
        return None
    hints = typing.get_type_hints(ServerArgs)
    return {f.name: hints.get(f.name) for f in dataclasses.fields(ServerArgs)}


def resolve_sglang_args(items: list[tuple[str, list[str] | Any]], *, owned: Mapping[str, str] | None = None,
                        where: str = "command line") -> dict[str, Any]:
    """Turn ``--sglang-*`` items into a ``{field: value}`` dict, rejecting runtime-owned fields
    (``owned``: field -> the flag that sets it instead).

    Values are kept as given (text) unless sglang is importable, in which case the name must be a
    ``ServerArgs`` field and the value is converted to its type. ``True`` means a bare switch.
    """
    known = _sglang_server_args()
    resolved: dict[str, Any] = {}
    for field, values in items:
        flag = SGLANG_PREFIX + field.replace("_", "-")
        if owned and field in owned:
            raise ConfigError(f"{flag} ({where}) is set by the runtime, not passed through: use {owned[field]}")
        if isinstance(values, list):
            value: Any = True if not values else values[0] if len(values) == 1 else values
        else:
            value = values  # from a config file: already typed
        if known is not None:
            if field not in known:
                raise ConfigError(f"{flag} ({where}): sglang's ServerArgs has no field {field!r}"
                                  + suggest(field, known))
            ftype = flag_type(known[field])
            if ftype is not None:
                value = convert_value(ftype, value, f"{flag} ({where})")
        resolved[field] = value
    return resolved


def resolve_megatron_values(values: dict[str, Any], *, extra: tuple[type, ...] = (), where: str) -> dict[str, Any]:
    """Check names and convert types of megatron values given in a config file."""
    flags = {flag.field: flag for flag in megatron_flags(extra)}
    resolved = {}
    for field, value in values.items():
        if field not in flags:
            raise ConfigError(f"{where}: megatron-core has no config field {field!r}" + suggest(field, flags))
        resolved[field] = convert_value(flags[field].ftype, value, f"{where}: {field}")
    return resolved
