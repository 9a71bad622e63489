"""benchmarks/front_load_table.py (the rows front_load.py --json wrote, as docs/agents.md's table) and
front_load.py's --router-cpus list."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.front_load import main as front_load_main
from benchmarks.front_load import parse_cpu_list
from benchmarks.front_load_table import main

ROW = {"engine": "http://127.0.0.1:30300", "client": "aiohttp", "turns": 3, "max_tokens": 128, "router_cpus": "8-9",
       "sessions": 1000, "requests": 3000, "requests_per_s": 250.04, "client_p50_ms": 3712.0, "client_p99_ms": 9050.0,
       "front_added_p50_ms": 1967.0, "front_added_p99_ms": 2586.0, "loop_lag_p50_ms": 3.0, "loop_lag_p99_ms": 28.0,
       "loop_lag_max_ms": 85.0, "router_cpu_ms_per_request": 1.814, "rss_growth_mib": 98.4,
       "bytes_per_session": 103180, "errors": 0, "first_error": None}


def test_a_row_reads_as_the_docs_columns(tmp_path, capsys):
    failed = ROW | {"client": "openai", "router_cpus": None, "loop_lag_max_ms": None, "errors": 2,
                    "first_error": "ReadTimeout: "}
    (tmp_path / "a.json").write_text(json.dumps(ROW))
    (tmp_path / "b.json").write_text(json.dumps(failed))
    assert main(["--engine-label", "SGLang, H100", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| load | req/s | client p50 / p99 s | front adds p50 / p99 ms |")
    assert lines[2] == ("| SGLang, H100, aiohttp client, 1,000 sessions × 3 turns, 128 tokens, router on CPUs 8-9 "
                        "| 250.0 | 3.7 / 9.1 | 1,967 / 2,586 | 3 / **28** / 85 | 1.81 | 98.4 MiB (103 kB) | 0 |")
    assert lines[3] == ("| SGLang, H100, openai client, 1,000 sessions × 3 turns, 128 tokens | 250.0 | 3.7 / 9.1 "
                        "| 1,967 / 2,586 | 3 / **28** / — | 1.81 | 98.4 MiB (103 kB) | 2 (first: ReadTimeout: ) |")


def test_an_unreadable_row_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "missing.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_router_cpus_is_a_taskset_list_of_this_machines_cpus():
    first = min(os.sched_getaffinity(0))
    assert parse_cpu_list(f"{first}") == {first}
    assert parse_cpu_list(f"{first}-{first},{first}") == {first}
    for bad in ("eight", "8-", ",1", "100000"):
        with pytest.raises(ValueError, match="--router-cpus"):
            parse_cpu_list(bad)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_a_client_pinned_to_other_cores_may_name_the_routers(monkeypatch):
    # The GPU driver runs front_load.py pinned to the client's cores and gives the router others.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert parse_cpu_list("1") == {1}


def test_a_bad_router_cpus_fails_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        front_load_main(["--router-cpus", "100000"])
    assert exit_info.value.code == 2
    assert "--router-cpus: '100000' names CPUs outside" in capsys.readouterr().err
