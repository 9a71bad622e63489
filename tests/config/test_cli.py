"""`slime-async` as a user first meets it: `train --help` is short enough to read (the project's
groups, then the Megatron and SGLang pass-through in a few lines) and imports none of torch,
megatron-core, transformers or sglang; `train --help-all` lists every flag, megatron-core's
included; no third-party warning reaches the console; the other commands answer `--help`
without the heavy imports either. Each runs the real CLI as a process (`python -m`, as the
console script does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "megatron", "transformers", "sglang"}


def run_cli(*args: str, importtime: bool = False) -> subprocess.CompletedProcess:
    python = [sys.executable, "-X", "importtime"] if importtime else [sys.executable]
    return subprocess.run([*python, "-m", "actors.loop.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


def imported_packages(stderr: str) -> set[str]:
    """Top-level packages named by ``-X importtime`` lines ("import time: self | total | name")."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def other_stderr(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("import time:")]


@pytest.fixture(scope="module")
def train_help() -> subprocess.CompletedProcess:
    return run_cli("train", "--help", importtime=True)


def test_train_help_imports_neither_torch_nor_megatron_nor_transformers_nor_sglang(train_help):
    assert train_help.returncode == 0, train_help.stderr[-2000:]
    assert "actors" in imported_packages(train_help.stderr)  # the parse above really was seen
    assert not imported_packages(train_help.stderr) & HEAVY
    assert other_stderr(train_help.stderr) == []  # no warnings


def test_train_help_shows_the_project_groups_first_and_summarises_the_pass_through(train_help):
    out = train_help.stdout
    assert out.splitlines()[0].startswith("usage: slime-async train [-h] [--help-all] [--config FILE]")
    titles = ["\ncluster:", "\nrollout:", "\nalgorithm:", "\nbuffer:", "\ntrainer:", "\nengine:", "\nrouter:",
              "\nmonitor:", "\ncheckpoint:", "\nmegatron-core pass-through (--help-all lists them):",
              "\nSGLang ServerArgs (pass-through):"]
    positions = [out.find(title) for title in titles]
    assert -1 not in positions and positions == sorted(positions), dict(zip(titles, positions))
    for flag in ("--n-samples-per-prompt", "--use-tis", "--hf-checkpoint", "--custom-rm-path"):
        assert f"\n  {flag}" in out, flag
    # megatron-core's generated flags are named in the summary, not listed one by one
    assert "--tensor-model-parallel-size 2" in out and "[megatron]" in out and "--sglang-<field>" in out
    assert "\n  --overlap-grad-reduce" not in out and "\n  --tensor-model-parallel-size" not in out


def test_train_help_all_lists_every_flag_megatron_included_without_warnings():
    result = run_cli("train", "--help-all")
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    for title in ("\nrollout:", "megatron-core TransformerConfig (pass-through)", "megatron-core OptimizerConfig "
                  "(pass-through)", "megatron-core DistributedDataParallelConfig (pass-through)",
                  "LR schedule (Megatron-LM's flags)", "SGLang ServerArgs (pass-through)"):
        assert title in out, title
    for flag in ("--n-samples-per-prompt", "--tensor-model-parallel-size", "--lr", "--overlap-grad-reduce",
                 "--lr-decay-style", "--swiglu"):
        assert f"\n  {flag} " in out or f"\n  {flag}\n" in out, flag
    assert result.stderr == ""  # megatron-core's Transformer-Engine/Apex warnings are not printed


def test_top_level_help_lists_the_commands_and_points_to_help_all():
    result = run_cli("--help", importtime=True)
    assert result.returncode == 0
    for word in ("train", "serve-engine", "router", "sandbox-server", "convert", "agent", "--help-all"):
        assert word in result.stdout, word
    assert not imported_packages(result.stderr) & HEAVY
    assert other_stderr(result.stderr) == []


@pytest.mark.parametrize("command", ["serve-engine", "router", "sandbox-server", "convert", "agent"])
def test_every_command_answers_help_without_the_heavy_imports(command):
    result = run_cli(command, "--help", importtime=True)
    assert result.returncode == 0, other_stderr(result.stderr)
    assert result.stdout.startswith(f"usage: slime-async {command}")
    assert not imported_packages(result.stderr) & HEAVY
    assert other_stderr(result.stderr) == []
