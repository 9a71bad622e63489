"""Weights an engine refuses: an external engine that serves another model than the trainer's
(shapes it asserts on, as SGLang's loader does) answers every update with ``success: false``."""

from pathlib import Path

import pytest

from conftest import base_argv
from examples.models.tiny import build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def other_model(tmp_path_factory) -> Path:
    """The same tokenizer and vocabulary as chaos_model, another width: it generates, but refuses its weights."""
    return build_tiny_model(tmp_path_factory.mktemp("other-model") / "model", arch="qwen2", hidden_size=32, seed=5)


def test_a_run_whose_only_engine_refuses_the_weights_stops_with_one_line_naming_it_and_its_refusal(
        launch, cpu_engine, chaos_model, chaos_data, other_model):
    # The distributed transport here; the disk transport's refusal (the default) ends the weight sync
    # naming the engine and its refusal in tests/loop/test_weight_sync_refusal.py, and the one-line
    # exit after it is the same code whatever the transport.
    engine = cpu_engine(other_model)
    run = launch([*base_argv(chaos_model, chaos_data, steps=2, mode="sync"), "--engine-type", "external",
                  "--rollout-external-engine-addrs", engine.url, "--update-weight-transport", "distributed"])
    assert run.wait(timeout=300) != 0
    last = run.log().strip().splitlines()[-1]
    assert last.startswith("error: "), run.log()[-3000:]
    assert engine.url in last and "shape mismatch" in last, last
    assert "Traceback" not in run.log().split("error: ", 1)[0][-2000:]
