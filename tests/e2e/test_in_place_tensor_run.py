"""End-to-end: fully-async with in-place weight updates over the same-device tensor transport.

The trainer and the CPU engine both stay resident (no --colocate): each sync pauses the engine's
requests in place, sends the weights as IPC handles (shared memory on CPU; CUDA IPC on one GPU),
sends no cache flush (the engine holds requests, and SGLang dies on a flush then), and continues
them on the new weights. Nothing is aborted, and a request that spans a sync carries each token's
true version.
"""

import json
import textwrap

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train

HOOKS = textwrap.dedent('''
    from actors.rollout.generate import default_generate

    async def long_generate(ctx, sample, sampling_params):
        # The full budget, longer than a train step here: every sync lands mid-generation.
        return await default_generate(ctx, sample, {**sampling_params, "ignore_eos": True})
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("in-place-tensor")
    model = build_tiny_model(root / "model", arch="qwen2", seed=2)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "label": str(2 * a)}) + "\n" for a in range(16)))
    (root / "in_place_hooks.py").write_text(HOOKS)
    return train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--train-mode", "fully-async", "--max-staleness", "1",
        "--weight-update-mode", "in_place", "--update-weight-transport", "tensor",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "3",
        # One generation at a time, each of the full 256 tokens (as tests/e2e/test_rl_run.py's run):
        # the admitted groups cannot all finish before a sync, so syncs land mid-generation.
        "--rollout-max-response-len", "256", "--rollout-concurrency", "1", "--rm-type", "exact",
        "--custom-generate-function-path", "in_place_hooks:long_generate",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4", "--use-tis",
    ], import_dirs=(root,))


def steps(metrics):
    return [m for m in metrics if "train/pg_loss" in m]


def test_every_step_trains_and_syncs_by_ipc_handles_without_aborting(run):
    trained = steps(run["metrics"])
    assert [m["train/version"] for m in trained] == [1.0, 2.0, 3.0]
    assert all(m["perf/weight_sync_buckets"] >= 1 for m in trained)
    assert all(m["rollout/staleness_max"] <= 1 for m in trained)
    assert not any(s["metadata"].get("resumes") for s in run["samples"])  # held in place, never aborted


def test_a_sample_that_spans_a_sync_keeps_each_tokens_version(run):
    spanning = [s for s in run["samples"] if len(set(s["token_versions"])) > 1]
    assert spanning, "no sync landed during a generation"
    for sample in spanning:
        versions = sample["token_versions"]
        assert versions == sorted(versions) and len(versions) == sample["response_length"]
