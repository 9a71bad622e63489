"""--use-rollout-routing-replay: refused at start on a dense checkpoint in one line naming the flag;
on an MoE one it starts the run's policy engines with SGLang's --enable-return-routed-experts (the
CPU engine's flag of the same name), not a teacher engine."""

from __future__ import annotations

import json

import pytest

from actors.engine.fleet import cpu_engine_spec
from actors.loop.run_config import parse_run_config
from examples.models.tiny import build_tiny_model
from slime_async.config.loader import preflight


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("r3config")
    (root / "prompts.jsonl").write_text(json.dumps({"prompt": "1+1=", "label": "2"}) + "\n")
    return {"dense": build_tiny_model(root / "dense", arch="qwen2"),
            "moe": build_tiny_model(root / "moe", arch="qwen3_moe", num_experts=4), "prompts": root / "prompts.jsonl"}


def argv(files, model: str) -> list[str]:
    return ["--hf-checkpoint", str(files[model]), "--prompt-data", str(files["prompts"]), "--use-rollout-routing-replay"]


def test_a_dense_checkpoint_is_refused_naming_the_flag(files):
    with pytest.raises(ValueError, match=r"^config: --use-rollout-routing-replay: --hf-checkpoint .* is not a mixture-of-experts"):
        preflight(parse_run_config(argv(files, "dense")))


def test_an_moe_checkpoint_starts_the_policy_engines_recording_experts(files):
    config = parse_run_config(argv(files, "moe"))
    preflight(config)
    assert config.rollout.use_rollout_routing_replay
    assert config.engine.sglang["enable_return_routed_experts"] is True
    policy = cpu_engine_spec("engine-0", str(files["moe"]), "127.0.0.1", 1, config.engine)
    teacher = cpu_engine_spec("teacher-engine", str(files["dense"]), "127.0.0.1", 2, config.engine, policy=False)
    assert "--enable-return-routed-experts" in policy.argv
    assert "--enable-return-routed-experts" not in teacher.argv
    assert parse_run_config(argv(files, "moe")[:-1]).engine.sglang == {}
