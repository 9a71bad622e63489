"""Every example config still parses: a flag that is renamed or removed fails here, not on a user."""

import tomllib
from pathlib import Path

import pytest

from actors.loop.run_config import parse_run_config

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "examples").rglob("*.toml"))


def test_the_examples_have_configs():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "examples")))
def test_an_example_config_parses(path, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)  # their paths are relative to the repository root
    # The data, the model and files under runs/ are written by each example's script: stand-ins here.
    flags = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "m"]
    if str(tomllib.loads(path.read_text()).get("rollout", {}).get("custom_config_path", "")).startswith("runs/"):
        (tmp_path / "settings.yaml").write_text("{}\n")
        flags += ["--custom-config-path", str(tmp_path / "settings.yaml")]
    parse_run_config(["--config", str(path), *flags])
