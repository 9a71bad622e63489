"""A supervised run's relative --save-hf lands where the command ran, not in the trainer's cwd."""

import json

from examples.models.tiny import build_tiny_model
from train_process import train


def test_a_relative_save_hf_is_written_under_the_directory_the_run_started_in(tmp_path):
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=0)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"reverse {n}:", "label": str(n)[::-1]}) + "\n"
                            for n in (123, 456, 789, 321)))
    train(tmp_path, ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--loss-type", "sft",
                     "--rollout-batch-size", "2", "--num-rollout", "1", "--micro-batch-size", "2",
                     "--save-hf", "exported/sft-hf"])  # relative: the test's cwd is tmp_path
    assert (tmp_path / "exported" / "sft-hf" / "config.json").is_file()
