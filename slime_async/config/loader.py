"""Build a typed run config from defaults, a TOML/YAML file and command-line flags.

Precedence: dataclass defaults < ``--config FILE`` < flags. A file holds one table per section
(``[rollout]``, ``[router]``, ...) plus ``[megatron]`` and ``[sglang]`` pass-through tables; a
key may also stand at the top level when its name is unique. Everything is checked before
anything is spawned: unknown flags and keys (with the nearest valid names), wrong types, and
each section's ``validate()``, then the root's cross-section ``validate()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from slime_async.config.flags import (
    ConfigError,
    FieldFlag,
    add_flags,
    convert_value,
    dataclass_flags,
    flag_name,
    suggest,
)
from slime_async.config.paths import require_file
from slime_async.config.passthrough import (
    SGLANG_PREFIX,
    megatron_flags,
    resolve_megatron_values,
    resolve_sglang_args,
    split_sglang_tokens,
)

MEGATRON_GROUPS = ("TransformerConfig", "OptimizerConfig", "DistributedDataParallelConfig", "ScheduleConfig",
                   "MegatronLMModelFlags")
_MEGATRON_GROUP_TITLES = {
    "ScheduleConfig": "LR schedule (Megatron-LM's flags)",
    "MegatronLMModelFlags": "Megatron-LM model flags (checked against the HF config, which defines the model)",
}


@dataclasses.dataclass(frozen=True)
class Schema:
    """The sections of a config root and where the pass-through values go."""

    root: type  # a dataclass whose fields are the sections
    megatron_section: str | None = None  # section with a ``megatron: dict`` field
    sglang_section: str | None = None  # section with a ``sglang: dict`` field
    # Called when the megatron flags are built: more dataclasses whose fields are megatron flags.
    megatron_extra: Callable[[], tuple[type, ...]] = tuple
    # SGLang fields the runtime sets itself -> the flag to use instead (rejected as pass-through).
    sglang_owned: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def sections(self) -> dict[str, type]:
        hints = typing.get_type_hints(self.root)
        return {f.name: hints[f.name] for f in dataclasses.fields(self.root)}

    def own_flags(self) -> list[FieldFlag]:
        flags = []
        for name, cls in self.sections().items():
            flags += dataclass_flags(name, cls)
        seen: dict[str, str] = {}
        for flag in flags:
            if flag.field in seen:
                raise ConfigError(f"flag {flag.flag} is defined by sections {seen[flag.field]} and {flag.section}")
            seen[flag.field] = flag.section
        return flags


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, exit 2 from the CLI) instead of printing the
    whole usage of several hundred flags, and reads ``-1e-6`` as a number, not as a flag. No
    abbreviations: among a thousand pass-through flags a typo that is some flag's prefix
    (``--max-stal 2``) would otherwise set that flag without a word."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # argparse's own pattern (set in __init__) misses exponents: "--min-lr -1e-6" failed.
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")

    def error(self, message: str):  # type: ignore[override]
        raise ConfigError(message)


HELP_ALL = "--help-all"


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every flag, built only when asked for (Megatron's flags come
    from importing megatron-core, seconds that ``--help`` should not cost)."""

    def __init__(self, option_strings, dest, full_help: Callable[[], str], **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, **kwargs)
        self._full_help = full_help

    def __call__(self, parser, namespace, values, option_string=None):
        print(self._full_help(), end="")
        parser.exit()


def build_parser(schema: Schema, prog: str, description: str = "", *,
                 passthrough: bool = True) -> tuple[argparse.ArgumentParser, list[FieldFlag]]:
    """The parser of ``schema``'s flags. ``passthrough=False`` leaves out the flags generated from
    megatron-core (a summary stands in their place): the parser ``--help`` prints, which must
    not import megatron-core or torch."""
    parser = _Parser(
        prog=prog,
        description=description,
        # argparse's own usage line lists every flag: hundreds of lines before the first group.
        usage=f"%(prog)s [-h] [{HELP_ALL}] [--config FILE] [--FLAG VALUE ...] [{SGLANG_PREFIX}FIELD VALUE ...]",
    )
    parser.add_argument(HELP_ALL, action=_HelpAll,
                        full_help=lambda: build_parser(schema, prog, description)[0].format_help(),
                        help="show every flag, megatron-core's pass-through included, and exit")
    parser.add_argument("--config", metavar="FILE", help="TOML or YAML config file; flags override it")
    flags = schema.own_flags()
    for section in schema.sections():
        group = parser.add_argument_group(f"{section}")
        add_flags(group, [f for f in flags if f.section == section])
    if schema.megatron_section is not None and passthrough:
        own = {f.field for f in flags}
        mflags = [f for f in megatron_flags(schema.megatron_extra()) if f.field not in own]
        for group_name in MEGATRON_GROUPS:
            title = _MEGATRON_GROUP_TITLES.get(group_name, f"megatron-core {group_name} (pass-through)")
            group = parser.add_argument_group(title)
            add_flags(group, [f for f in mflags if f.help.startswith(f"[{group_name}]")])
        flags += mflags
    elif schema.megatron_section is not None:
        parser.add_argument_group(
            f"megatron-core pass-through ({HELP_ALL} lists them)",
            "every field of the installed megatron-core's TransformerConfig, OptimizerConfig and "
            "DistributedDataParallelConfig as --<field-name> (--tensor-model-parallel-size 2 --lr 1e-6 "
            "--clip-grad 1.0 --bf16; a [megatron] table in a config file), and Megatron-LM's LR-schedule "
            "flags (--lr-warmup-iters, --lr-decay-style ...) and model flags (--num-layers, --swiglu ..., "
            "checked against the HF config).",
        )
    if schema.sglang_section is not None:
        parser.add_argument_group(
            "SGLang ServerArgs (pass-through)",
            f"{SGLANG_PREFIX}<field> [VALUE ...] for every sglang ServerArgs field (e.g. "
            f"{SGLANG_PREFIX}mem-fraction-static 0.7; a [sglang] table in a config file), forwarded verbatim "
            "to sglang.launch_server; runtime-owned fields (model path, host, port, tp size, base gpu id, "
            "nccl port, dist init addr) are rejected. sglang's own `python -m sglang.launch_server --help` "
            "lists them.",
        )
    return parser, flags


def load_config(schema: Schema, argv: list[str], prog: str = "slime-async", description: str = "") -> Any:
    """Parse ``argv`` into an instance of ``schema.root`` or raise ConfigError."""
    rest, sglang_items = split_sglang_tokens(argv)
    if sglang_items and schema.sglang_section is None:
        raise ConfigError(f"{SGLANG_PREFIX}* flags are not accepted by {prog}")
    # -h prints the project's groups and a summary of the pass-through, without importing megatron-core.
    wants_help = any(token in ("-h", "--help") for token in rest)
    parser, flags = build_parser(schema, prog, description, passthrough=not wants_help)
    namespace, unknown = parser.parse_known_args(rest)
    if unknown:
        option = next((u for u in unknown if u.startswith("-")), unknown[0])
        known = [f.flag for f in flags] + ["--no-" + f.flag[2:] for f in flags if f.ftype.is_bool]
        raise ConfigError(f"unknown flag {option}" + suggest(option.split("=")[0], known)
                          if option.startswith("-") else f"unexpected argument {option!r}")
    by_field = {f.field: f for f in flags}
    values: dict[str, dict[str, Any]] = {name: {} for name in schema.sections()}
    sglang: dict[str, Any] = {}
    if namespace.config:
        file_values, file_sglang = _read_file(Path(namespace.config), schema, by_field)
        _merge(values, file_values)
        sglang.update(file_sglang)
    for dest, raw in vars(namespace).items():
        if dest == "config":
            continue
        section, field = dest.split(".", 1)
        flag = by_field[field]
        values.setdefault(section, {})[field] = convert_value(flag.ftype, raw, flag.flag)
    sglang.update(resolve_sglang_args(sglang_items, owned=schema.sglang_owned))
    if "megatron" in values:
        megatron = values.pop("megatron")
        if megatron:
            values[schema.megatron_section].setdefault("megatron", {}).update(megatron)
    if sglang:
        values[schema.sglang_section].setdefault("sglang", {}).update(sglang)
    return _construct(schema, values)


def _merge(into: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    for section, fields in new.items():
        into.setdefault(section, {}).update(fields)


def _read_file(path: Path, schema: Schema, by_field: dict[str, FieldFlag]) -> tuple[dict, dict]:
    try:
        text = require_file(path, "--config").read_text()
    except UnicodeDecodeError:
        raise ConfigError(f"--config {path}: not a UTF-8 text file") from None
    except ValueError as error:
        raise ConfigError(str(error)) from None
    except OSError as error:
        raise ConfigError(f"--config {path}: {error.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"--config {path}: use a .toml, .yaml or .yml file")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"--config {path}: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a table/mapping")
    sections = schema.sections()
    values: dict[str, dict[str, Any]] = {}
    sglang: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}: {key}"
        if key == "sglang" and schema.sglang_section is not None:
            sglang.update(resolve_sglang_args(list(_as_table(value, where).items()), owned=schema.sglang_owned,
                                              where=str(path)))
        elif key == "megatron" and schema.megatron_section is not None:
            values.setdefault("megatron", {}).update(resolve_megatron_values(
                _as_table(value, where), extra=schema.megatron_extra(), where=where))
        elif key in sections:
            for field, item in _as_table(value, where).items():
                values.setdefault(key, {})[field] = _file_value(schema, key, field, item, path, by_field)
        elif key in by_field:
            flag = by_field[key]
            section = flag.section
            values.setdefault(section, {})[key] = convert_value(flag.ftype, value, f"{path}: {key}")
        else:
            raise ConfigError(f"{path}: unknown key {key!r}" + suggest(key, [*sections, *by_field]))
    return values, sglang


def _file_value(schema: Schema, section: str, field: str, value: Any, path: Path, by_field: dict[str, FieldFlag]) -> Any:
    where = f"{path}: {section}.{field}"
    cls = schema.sections()[section]
    names = {f.name for f in dataclasses.fields(cls)}
    if field not in names:
        raise ConfigError(f"{where}: section {section!r} has no field {field!r}" + suggest(field, names))
    flag = by_field.get(field)
    if flag is None or flag.section != section:
        return value  # not a flag (e.g. a dict): taken as written
    return convert_value(flag.ftype, value, where)


def _as_table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table/mapping, got {type(value).__name__}")
    return value


def _construct(schema: Schema, values: dict[str, dict[str, Any]]) -> Any:
    sections = {}
    for name, cls in schema.sections().items():
        try:
            section = cls(**values.get(name, {}))
        except TypeError as error:
            raise ConfigError(f"section {name}: {error}") from None
        _validate(section, name)
        sections[name] = section
    root = schema.root(**sections)
    _validate(root, "config")
    return root


def _validate(obj: Any, name: str) -> None:
    validate = getattr(obj, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


def preflight(config: Any) -> None:
    """Check what a config names outside itself (files, directories, importable hooks): each
    section's ``preflight()``, then the root's. Run once at start, before anything is spawned;
    kept apart from ``validate()`` so a config can be built and checked without those files."""
    for f in dataclasses.fields(config):
        _check(getattr(config, f.name), "preflight", f.name)
    _check(config, "preflight", "config")


def _check(obj: Any, method: str, name: str) -> None:
    check = getattr(obj, method, None)
    if check is None:
        return
    try:
        check()
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"{name}: {error}") from None


def config_to_dict(config: Any) -> dict[str, Any]:
    """A plain, YAML-safe dict of a config (enums and dtypes as text)."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        if hasattr(value, "value") and hasattr(value, "name"):  # enum
            return value.value
        return str(value)

    return plain(config)


def dump_config(config: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


def print_config(config: Any, file=sys.stdout) -> None:
    print(yaml.safe_dump(config_to_dict(config), sort_keys=False), file=file, end="")


__all__ = ["ConfigError", "Schema", "build_parser", "load_config", "preflight", "dump_config", "print_config",
           "config_to_dict", "flag_name"]
