"""Command-line flags generated from dataclass fields.

A field ``n_samples_per_prompt: int`` becomes ``--n-samples-per-prompt N``; a ``bool`` becomes
``--flag`` / ``--no-flag``; ``Literal`` and ``Enum`` fields get choices; ``list[T]`` takes one or
more values; ``Optional[T]`` also accepts ``none``; a ``JsonDict`` field takes a JSON object
(``--flag '{"k": 1}'``, or a table in a config file). Help comes from ``field(metadata={"help":
...})``. Fields whose type cannot be written on a command line (callables, dicts) are not flags.

Every argument is registered with ``default=SUPPRESS``, so a parsed namespace holds only what
the user actually typed; that is what lets file values sit between defaults and the CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import importlib
import json
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

_NONE_WORDS = {"none", "null"}
_TRUE_WORDS = {"1", "true", "yes", "on"}
_FALSE_WORDS = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class FlagType:
    """How to read one field's value from text (or from a config file's value)."""

    convert: Callable[[Any], Any]
    is_bool: bool = False
    is_list: bool = False
    # Union[T, List[T]] (megatron-core's moe_aux_loss_coeff, moe_router_load_balancing_type...): one value
    # stays a T, as megatron-core reads a one-element list as a per-type list its other fields must match.
    scalar_if_one: bool = False
    optional: bool = False
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    # The annotation this was read from, as JSON-able data ("int",), ("literal", [values]), ("enum",
    # module, qualname) ...: `flag_type_from_source` rebuilds the same FlagType from it, so a cached
    # flag table (slime_async.config.megatron_table) needs no import of the annotated module.
    source: tuple[Any, ...] = ()


class JsonDict(dict):
    """Annotation for a dict-valued flag given as JSON text (slime's ``--apply-chat-template-kwargs``).

    Plain ``dict`` fields are never flags (the pass-through tables are dicts); this marks the
    ones that are. The value stored is a plain ``dict``.
    """


def _to_json_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{value!r} is not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return dict(value)


def field_help(text: str) -> dict[str, str]:
    """``field(metadata=field_help("..."))``: the help text of the flag a field becomes."""
    return {"help": text}


class ConfigError(ValueError):
    """A bad flag, config file entry or combination; the message names it."""


def flag_type(tp: Any) -> FlagType | None:
    """The FlagType for a type annotation, or None when it cannot be a flag."""
    optional = False
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        list_args = [a for a in args if typing.get_origin(a) in (list, typing.List)]
        if list_args:  # Union[int, List[int]] or Optional[List[int]]: a list of one or more
            inner = flag_type(list_args[0])
            # Only a union that also admits the scalar (Union[T, List[T]]) keeps one value as a T.
            scalar_if_one = len(args) > len(list_args)
            return dataclasses.replace(inner, optional=optional, scalar_if_one=scalar_if_one) if inner else None
        if len(args) != 1:
            return None
        inner = flag_type(args[0])
        return dataclasses.replace(inner, optional=optional) if inner else None
    if origin in (list, typing.List, tuple, typing.Tuple):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        item = flag_type(args[0]) if args else flag_type(str)
        if item is None or item.is_list or item.is_bool:
            return None
        return dataclasses.replace(item, is_list=True)
    if origin is typing.Literal:
        values = typing.get_args(tp)
        by_text = {str(v): v for v in values}
        return FlagType(lambda x: _choice(x, by_text), choices=tuple(by_text), source=("literal", list(values)))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        by_name = {m.name.lower(): m for m in tp} | {str(m.value).lower(): m for m in tp}
        return FlagType(lambda x: x if isinstance(x, tp) else _choice(str(x).lower(), by_name),
                        choices=tuple(m.name.lower() for m in tp), source=("enum", tp.__module__, tp.__qualname__))
    if tp is JsonDict:
        return FlagType(_to_json_dict, metavar="JSON", source=("json",))
    if tp is bool:
        return FlagType(_to_bool, is_bool=True, source=("bool",))
    if tp is int:
        return FlagType(_to_int, metavar="N", source=("int",))
    if tp is float:
        return FlagType(_to_float, metavar="X", source=("float",))
    if tp is str:
        return FlagType(str, metavar="STR", source=("str",))
    if _is_torch_dtype(tp):
        return _torch_dtype_flag()
    return None


_LEAF_TYPES: dict[str, Any] = {"json": JsonDict, "bool": bool, "int": int, "float": float, "str": str}


def flag_type_from_source(source: list[Any] | tuple[Any, ...], *, is_list: bool = False, optional: bool = False,
                          scalar_if_one: bool = False, choices: list[str] | tuple[str, ...] | None = None) -> FlagType:
    """The FlagType that ``flag_type`` made from the annotation ``source`` describes (its shape:
    list, optional, ...), without importing the annotated module: an Enum's class is imported
    only when a value is converted."""
    kind, *rest = source
    if kind == "literal":
        leaf = flag_type(typing.Literal[tuple(rest[0])])
    elif kind == "enum":
        module, qualname = rest
        leaf = FlagType(lambda x: _enum_flag(module, qualname).convert(x), source=tuple(source),
                        choices=tuple(choices or ()))
    elif kind == "dtype":
        leaf = _torch_dtype_flag()
    else:
        leaf = flag_type(_LEAF_TYPES[kind])
    assert leaf is not None, source
    return dataclasses.replace(leaf, is_list=is_list, optional=optional, scalar_if_one=scalar_if_one)


def _enum_flag(module: str, qualname: str) -> FlagType:
    cls: Any = importlib.import_module(module)
    for name in qualname.split("."):
        cls = getattr(cls, name)
    ftype = flag_type(cls)
    assert ftype is not None, qualname
    return ftype


def _choice(value: Any, options: dict[str, Any]) -> Any:
    key = str(value)
    if key not in options:
        raise ValueError(f"{value!r} is not one of {', '.join(options)}")
    return options[key]


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise ValueError(f"{value!r} is not a boolean")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(str(value), 0)
    except ValueError:
        raise ValueError(f"{value!r} is not an integer") from None


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a number") from None


def _is_torch_dtype(tp: Any) -> bool:
    return getattr(tp, "__module__", "") == "torch" and getattr(tp, "__name__", "") == "dtype"


def _torch_dtype_flag() -> FlagType:
    names = ("float32", "float16", "bfloat16")

    def convert(value: Any) -> Any:
        import torch

        if isinstance(value, torch.dtype):
            return value
        return getattr(torch, _choice(str(value).removeprefix("torch."), {n: n for n in names}))

    return FlagType(convert, choices=names, source=("dtype",))


def convert_value(ftype: FlagType, value: Any, where: str) -> Any:
    """Convert a value from the command line or a config file; errors name ``where``."""
    try:
        if value is None or (isinstance(value, str) and value.lower() in _NONE_WORDS and ftype.optional):
            if not ftype.optional:
                raise ValueError("a value is required")
            return None
        if ftype.is_list:
            items = value if isinstance(value, (list, tuple)) else [value]
            converted = [ftype.convert(item) for item in items]
            return converted[0] if ftype.scalar_if_one and len(converted) == 1 else converted
        return ftype.convert(value)
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


@dataclass(frozen=True)
class FieldFlag:
    """One generated flag: where its value goes and how to read it."""

    section: str
    field: str
    ftype: FlagType
    default: Any
    help: str

    @property
    def flag(self) -> str:
        return flag_name(self.field)


def dataclass_flags(section: str, cls: type, *, skip: Iterable[str] = ()) -> list[FieldFlag]:
    """FieldFlags for every field of ``cls`` that can be a flag."""
    hints = typing.get_type_hints(cls)
    flags = []
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name.startswith("_") or f.metadata.get("flag") is False:
            continue
        ftype = flag_type(hints[f.name])
        if ftype is None:
            continue
        flags.append(FieldFlag(section, f.name, ftype, _field_default(f), f.metadata.get("help", "")))
    return flags


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def default_text(default: Any) -> str:
    """A flag's default as ``--help`` shows it."""
    return default.name.lower() if isinstance(default, enum.Enum) else str(default)


def add_flags(group: argparse._ArgumentGroup, flags: list[FieldFlag]) -> None:
    for flag in flags:
        dest = f"{flag.section}.{flag.field}"
        default = default_text(flag.default)
        help_text = f"{flag.help} (default: {default})" if flag.help else f"(default: {default})"
        help_text = help_text.replace("%", "%%")
        if flag.ftype.is_bool:
            group.add_argument(flag.flag, dest=dest, action="store_const", const=True,
                               default=argparse.SUPPRESS, help=help_text)
            group.add_argument("--no-" + flag.flag[2:], dest=dest, action="store_const", const=False,
                               default=argparse.SUPPRESS, help=argparse.SUPPRESS)
            continue
        group.add_argument(
            flag.flag,
            dest=dest,
            default=argparse.SUPPRESS,
            nargs="+" if flag.ftype.is_list else None,
            metavar=_metavar(flag.ftype),
            help=help_text,
        )


def _metavar(ftype: FlagType) -> str | None:
    if ftype.choices:
        return "{" + ",".join(ftype.choices) + "}"
    return ftype.metavar


def suggest(name: str, known: Iterable[str], n: int = 3) -> str:
    """' (did you mean --a, --b?)' for the nearest known names, or ''."""
    close = difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""
