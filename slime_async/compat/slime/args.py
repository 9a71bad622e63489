"""``SlimeArgs``: the ``args`` a slime plug-in receives, built once from the typed config.

slime passes its whole argparse namespace to every hook. Here each actor gets only its own config
section; plug-ins get this read-only view instead, with slime's attribute names (most of ours
already are slime's flag names; the rollout's adapter adds the derived ones such as
``sglang_router_ip`` / ``sglang_router_port``). Reading a name slime has but this runtime does
not raises AttributeError naming it, so ``getattr(args, name, default)`` works as in slime.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterator, Mapping
from typing import Any

SERVICES_ATTR = "_slime_async_services"  # where the adapter's CompatServices sit on args


class SlimeArgs:
    """Attribute access over a frozen mapping of slime argument names."""

    __slots__ = ("_values", "_unavailable", "_services", "_missing")

    def __init__(self, values: Mapping[str, Any], *, unavailable: Mapping[str, str] | None = None,
                 services: Any = None, missing: str = "slime-async has no such setting"):
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_missing", missing)  # what an unknown name means for this args
        # name -> why it has no value in this run (e.g. no router HTTP front): raised on access.
        object.__setattr__(self, "_unavailable", dict(unavailable or {}))
        object.__setattr__(self, "_services", services)

    def __getattr__(self, name: str) -> Any:
        if name == SERVICES_ATTR:
            return self._services
        values = self._values
        if name in values:
            return values[name]
        if name in self._unavailable:
            raise AttributeError(f"args.{name}: {self._unavailable[name]}")
        close = difflib.get_close_matches(name, list(values), n=3, cutoff=0.7)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise AttributeError(f"args.{name}: {self._missing}{hint}")

    def __setattr__(self, name: str, value: Any) -> None:
        # One args object serves every hook call of a run: a write would leak between samples
        # and turn config into hidden state. Say what to do instead.
        raise AttributeError(f"args is read-only (cannot set args.{name}): it is built once from the config; "
                             "keep per-sample state on the sample and per-run state in your module")

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __dir__(self) -> list[str]:
        return sorted(self._values)

    def __repr__(self) -> str:
        return f"SlimeArgs({len(self._values)} settings)"

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


def flatten_config(config: Any) -> dict[str, Any]:
    """One flat ``{name: value}`` of a run config (a dataclass of section dataclasses).

    Field names are already slime's flag names; the ``megatron`` pass-through dict contributes
    its entries as they are and the ``sglang`` one as ``sglang_<field>``, as slime names them.
    """
    flat: dict[str, Any] = {}
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if not dataclasses.is_dataclass(value):
            flat[section.name] = value
            continue
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.name == "megatron" and isinstance(item, dict):
                flat.update(item)
            elif f.name == "sglang" and isinstance(item, dict):
                flat.update({f"sglang_{k}": v for k, v in item.items()})
            else:
                flat[f.name] = item
    return flat
