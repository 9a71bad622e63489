"""megatron-core's config fields as a table, cached on disk.

Every `slime-async train` parses megatron-core's pass-through flags (generated from the
installed ``TransformerConfig``, ``OptimizerConfig`` and ``DistributedDataParallelConfig``) and
checks which dataclass each ``[megatron]`` key belongs to. Importing megatron-core for that
costs seconds (torch._dynamo, wandb, ... come with it) in a supervisor that never builds a
model. The table — each field's flag (type, default text, help) and each dataclass's field
names — is built by importing megatron-core once and stored as JSON; later runs read the file.

The cache key covers everything the table is derived from: the Python version, megatron-core's
version and every source file under ``megatron/core`` (path, size, mtime), and the code that
reads annotations into flags. A new or edited megatron-core, or a change to this code, misses
and rebuilds; so the table read is always the one an import would give.
``SLIME_ASYNC_CACHE_DIR`` (else ``$XDG_CACHE_HOME/slime-async``, else ``~/.cache/slime-async``)
holds the file; where it cannot be written, every run imports megatron-core as before.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_async.config import flags as _flags_module
from slime_async.config.flags import FieldFlag, dataclass_flags, flag_type_from_source

# The three megatron-core dataclasses the pass-through fills (the order is the flags' and their help groups').
MEGATRON_CONFIGS = ("TransformerConfig", "OptimizerConfig", "DistributedDataParallelConfig")
_FORMAT = 1  # bump when the file's layout changes


@dataclass(frozen=True)
class MegatronTable:
    flags: tuple[FieldFlag, ...]  # one per field that can be a flag; a name in two dataclasses once
    fields: dict[str, frozenset[str]]  # dataclass name -> all its field names (flags or not)


@functools.cache
def megatron_table() -> MegatronTable:
    """The table of the installed megatron-core, from the cache when it is current."""
    key, directory = _cache_key(), _cache_dir()
    path = directory / f"megatron_table-{key[:16]}.json" if key and directory else None
    if path is not None:
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return _from_json(data)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent, unreadable or torn: rebuilt below
    data = _build()
    if path is not None:
        _write(path, {**data, "key": key})
    return _from_json(data)


def _build() -> dict[str, Any]:
    """Import megatron-core and read its three config dataclasses."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    classes = (TransformerConfig, OptimizerConfig, DistributedDataParallelConfig)
    flags: dict[str, dict[str, Any]] = {}
    for cls in classes:
        for flag in dataclass_flags("megatron", cls):
            ftype = flag.ftype
            flags.setdefault(flag.field, {
                "field": flag.field, "source": list(ftype.source), "is_list": ftype.is_list,
                "optional": ftype.optional, "scalar_if_one": ftype.scalar_if_one,
                "choices": list(ftype.choices) if ftype.choices is not None else None,
                "default": _flags_module.default_text(flag.default),
                "help": f"[{cls.__name__}] {flag.help}".strip()})
    return {"format": _FORMAT, "flags": list(flags.values()),
            "fields": {cls.__name__: sorted(f.name for f in dataclasses.fields(cls)) for cls in classes}}


def _from_json(data: dict[str, Any]) -> MegatronTable:
    if data["format"] != _FORMAT:
        raise ValueError("another format")
    flags = []
    for entry in data["flags"]:
        ftype = flag_type_from_source(entry["source"], is_list=entry["is_list"], optional=entry["optional"],
                                      scalar_if_one=entry["scalar_if_one"], choices=entry["choices"])
        flags.append(FieldFlag("megatron", entry["field"], ftype, entry["default"], entry["help"]))
    return MegatronTable(tuple(flags), {name: frozenset(names) for name, names in data["fields"].items()})


def _cache_key() -> str | None:
    """A digest of what the table is derived from; None where megatron-core is not installed."""
    import hashlib  # here: `train --help` imports this module and needs none of these
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("megatron")  # a namespace package: finding it imports nothing
        version = importlib.metadata.version("megatron-core")
    except (ImportError, ValueError, importlib.metadata.PackageNotFoundError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    digest = hashlib.sha256(f"{_FORMAT} {sys.version} {version}".encode())
    for module in (_flags_module, sys.modules[__name__]):
        digest.update(Path(module.__file__ or "").read_bytes())
    for location in spec.submodule_search_locations:
        for directory, subdirs, files in os.walk(os.path.join(location, "core")):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    stat = os.stat(os.path.join(directory, name))
                    digest.update(f"{directory}/{name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _cache_dir() -> Path | None:
    if explicit := os.environ.get("SLIME_ASYNC_CACHE_DIR"):
        return Path(explicit)
    try:
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slime-async"
    except RuntimeError:  # no home directory to be found: no cache
        return None


def _write(path: Path, data: dict[str, Any]) -> None:
    """Write atomically (runs starting together never read half a file); a read-only cache is skipped."""
    import tempfile

    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp",
                                         delete=False) as tmp:
            json.dump(data, tmp)
        os.replace(tmp.name, path)
    except OSError:
        if tmp is not None:
            Path(tmp.name).unlink(missing_ok=True)
