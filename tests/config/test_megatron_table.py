"""megatron-core's config fields, cached on disk (slime_async/config/megatron_table.py): the
supervisor's config path (parse, checks, preflight) imports no megatron-core, sglang or
transformers once the table is cached, and parses to the same config as on the run that built
it; the table read back is the one an import of megatron-core builds; a torn file is rebuilt."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from examples.models.tiny import build_tiny_model
from slime_async.config import megatron_table as table_module

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("megatron", "sglang", "transformers")
# What `slime-async train` runs in the supervisor before it spawns a child (actors/loop/cli.py's _train).
PROBE = """
import json, sys
from slime_async.config.loader import preflight
from actors.loop.run_config import parse_run_config
config = parse_run_config(sys.argv[1:])
preflight(config)
print(json.dumps({"heavy": sorted({name.split(".")[0] for name in sys.modules} & set(%r)),
                  "megatron": repr(config.trainer.megatron)}))
""" % (HEAVY,)


def supervisor_config_path(argv: list[str], cache: Path) -> dict:
    env = {**os.environ, "SLIME_ASYNC_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_the_supervisors_config_path_imports_no_megatron_once_the_table_is_cached(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=0)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    argv = ["--hf-checkpoint", str(model), "--prompt-data", str(tmp_path / "prompts.jsonl"), "--engine-type", "cpu",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--micro-batch-size", "4",
            "--lr", "1e-4", "--clip-grad", "0.5", "--params-dtype", "bfloat16", "--recompute-granularity", "full",
            "--lr-decay-style", "cosine", "--lr-decay-iters", "10"]
    cache = tmp_path / "cache"
    first = supervisor_config_path(argv, cache)  # builds the table: imports megatron-core once
    assert "megatron" in first["heavy"] and len(list(cache.glob("megatron_table-*.json"))) == 1
    second = supervisor_config_path(argv, cache)
    assert second["heavy"] == []
    assert second["megatron"] == first["megatron"]
    assert "'params_dtype': torch.bfloat16" in second["megatron"] and "'lr_decay_iters': 10" in second["megatron"]


def _comparable(flag) -> tuple:
    return (flag.section, flag.field, str(flag.default), flag.help,
            dataclasses.replace(flag.ftype, convert=None))


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SLIME_ASYNC_CACHE_DIR", str(tmp_path))
    table_module.megatron_table.cache_clear()
    yield tmp_path
    table_module.megatron_table.cache_clear()


def test_the_table_read_back_is_the_one_megatron_core_builds(cache_dir):
    built = table_module._from_json(table_module._build())
    table_module.megatron_table()  # writes the file
    table_module.megatron_table.cache_clear()
    read = table_module.megatron_table()  # reads it
    assert [_comparable(f) for f in read.flags] == [_comparable(f) for f in built.flags]
    assert read.fields == built.fields and "lr" in read.fields["OptimizerConfig"]
    by_field = {f.field: f.ftype for f in read.flags}
    assert by_field["attention_backend"].convert("local").name == "local"  # an Enum: imported on conversion
    assert by_field["window_size"].is_list and by_field["recompute_granularity"].convert("full") == "full"


def test_a_torn_cache_file_is_rebuilt(cache_dir):
    expected = table_module.megatron_table()
    (path,) = cache_dir.glob("megatron_table-*.json")
    path.write_text('{"key": "')  # a writer killed mid-file (the real writer renames a whole file into place)
    table_module.megatron_table.cache_clear()
    assert table_module.megatron_table().fields == expected.fields
    assert json.loads(path.read_text())["fields"]["TransformerConfig"]


def test_an_unwritable_cache_directory_only_means_no_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SLIME_ASYNC_CACHE_DIR", str(blocker / "cache"))  # under a file: mkdir fails
    table_module.megatron_table.cache_clear()
    try:
        assert "lr" in table_module.megatron_table().fields["OptimizerConfig"]
    finally:
        table_module.megatron_table.cache_clear()
    assert list(tmp_path.iterdir()) == [blocker]  # nothing written, no temporary file left
