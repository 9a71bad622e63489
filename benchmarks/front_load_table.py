"""The rows ``benchmarks/front_load.py --json FILE`` wrote, as one markdown table (docs/agents.md's columns).

    python benchmarks/front_load_table.py [--engine-label NAME] ROW.json [ROW.json ...]

Each file is one load; its label comes from the load's own parameters in the file (engine, client,
sessions, turns, max_tokens; the router's CPUs when it was pinned). ``--engine-label`` names the
engine in every row instead of its URL (e.g. "SGLang, Qwen2 120 M, H100").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HEADER = ("| load | req/s | client p50 / p99 s | front adds p50 / p99 ms | loop lag p50 / p99 / max ms "
          "| router CPU ms/req | RSS growth (per session) | errors |\n|---|---|---|---|---|---|---|---|")


def _number(value: Any, digits: int = 0) -> str:
    """``1234.5`` -> ``1,234`` (digits=0) or ``1,234.5``; a missing value -> ``—``."""
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def label(row: dict[str, Any], engine: str | None = None) -> str:
    pinned = f", router on CPUs {row['router_cpus']}" if row.get("router_cpus") else ""
    return (f"{engine or row.get('engine', '?')}, {row.get('client', '?')} client, {row['sessions']:,} sessions × "
            f"{row.get('turns', '?')} turns, {row.get('max_tokens', '?')} tokens{pinned}")


def table_row(row: dict[str, Any], engine: str | None = None) -> str:
    client = f"{_number(row['client_p50_ms'] and row['client_p50_ms'] / 1000, 1)} / " \
             f"{_number(row['client_p99_ms'] and row['client_p99_ms'] / 1000, 1)}"
    added = f"{_number(row['front_added_p50_ms'])} / {_number(row['front_added_p99_ms'])}"
    lag = f"{_number(row['loop_lag_p50_ms'])} / **{_number(row['loop_lag_p99_ms'])}** / {_number(row['loop_lag_max_ms'])}"
    rss = f"{_number(row['rss_growth_mib'], 1)} MiB ({_number(row['bytes_per_session'] / 1000)} kB)"
    errors = str(row["errors"]) + (f" (first: {row['first_error']})" if row["errors"] else "")
    return (f"| {label(row, engine)} | {_number(row['requests_per_s'], 1)} | {client} | {added} | {lag} "
            f"| {_number(row['router_cpu_ms_per_request'], 2)} | {rss} | {errors} |")


def table(rows: list[dict[str, Any]], engine: str | None = None) -> str:
    return "\n".join([HEADER, *(table_row(row, engine) for row in rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="+", type=Path, help="files front_load.py --json wrote")
    parser.add_argument("--engine-label", default=None, help="the engine's name in every row (default: its URL)")
    args = parser.parse_args(argv)
    rows = []
    for path in args.rows:
        try:
            rows.append(json.loads(path.read_text()))
        except (OSError, ValueError) as error:
            print(f"front_load_table: {path}: {error}", file=sys.stderr)
            return 2
    print(table(rows, args.engine_label))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
