"""The torchrun group runs in the repository root: a run started elsewhere with relative paths
must hand it absolute ones (a relative --run-dir failed at start: trainer_config.json not found)."""

import json
from pathlib import Path

from actors.megatron.config import TrainerConfig
from actors.trainer.actor import TrainerActor


def test_relative_checkpoint_paths_resolve_against_the_users_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = TrainerConfig(hf_checkpoint="models/base", ref_load="models/ref").with_absolute_paths()
    assert config.hf_checkpoint == str(tmp_path / "models" / "base")
    assert config.ref_load == str(tmp_path / "models" / "ref")


def test_torchrun_gets_an_absolute_config_file_with_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "logs").mkdir(parents=True)
    spec = TrainerActor(TrainerConfig(hf_checkpoint="base"), log_dir="run/logs")._spec(rpc_port=1)
    config_json = Path(spec.argv[spec.argv.index("--config-json") + 1])
    assert config_json.is_absolute() and config_json.is_file()
    assert json.loads(config_json.read_text())["hf_checkpoint"] == str(tmp_path / "base")
