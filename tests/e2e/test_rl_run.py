"""End-to-end: `slime-async train` as a real process tree (CPU engine + Megatron CPU trainer).

One fully-async run with --max-staleness 1 exercises the acceptance points that need a real
run: the staleness bound holds at every step and drops are counted; weight updates land while
long generations are in flight and those samples resume from their partial tokens; a reward
function that raises and a malformed data row are counted and survived.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from examples.models.tiny import build_tiny_model
from train_process import train

# The second run below checks the distributed weight path: sync mode, weights broadcast from
# trainer rank 0 to two engines over gloo after every step.

REWARD_MODULE = textwrap.dedent('''
    from actors.rollout.generate import default_generate

    async def long_generate(ctx, sample, sampling_params):
        # Always the full budget (256 tokens, longer than a train step here), so weight updates land
        # while generations are in flight.
        return await default_generate(ctx, sample, {**sampling_params, "ignore_eos": True})

    async def rm(ctx, sample):
        if sample.index == 0 and sample.group_index % 2 == 0:
            raise RuntimeError("reward service unavailable")
        return float(len(sample.response_tokens) % 2)
''')


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data = root / "prompts.jsonl"
    rows = [json.dumps({"prompt": f"{a}+{a + 1}=", "label": str(2 * a + 1)}) for a in range(24)]
    rows.insert(5, "{this row is not json")
    data.write_text("\n".join(rows) + "\n")
    (root / "e2e_reward.py").write_text(REWARD_MODULE)
    result = train(root, [
        "--hf-checkpoint", str(model), "--prompt-data", str(data),
        "--train-mode", "fully-async", "--max-staleness", "1",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "5",
        # One generation at a time: the admitted groups cannot all finish before the weight sync
        # (with 4 in parallel they sometimes did, and no abort landed mid-generation).
        "--rollout-max-response-len", "256", "--rollout-concurrency", "1", "--custom-rm-path", "e2e_reward:rm",
        "--custom-generate-function-path", "e2e_reward:long_generate",
        "--engine-type", "cpu", "--micro-batch-size", "4", "--lr", "1e-4", "--use-tis",
        "--trace-dir", str(root / "trace"),
    ], import_dirs=(root,))
    return {**result, "model": model, "root": root}


def train_steps(metrics):
    return [m for m in metrics if "train/pg_loss" in m or "rollout/staleness_max" in m]


def test_the_staleness_bound_holds_at_every_step(run):
    steps = train_steps(run["metrics"])
    assert len(steps) == 5
    assert all(m["rollout/staleness_max"] <= 1 for m in steps)
    assert "buffer/dropped_stale" in steps[-1]  # drops are counted (zero or more)


def test_every_step_trained_and_synced_weights(run):
    steps = train_steps(run["metrics"])
    assert [m["train/version"] for m in steps] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert all("perf/weight_sync_time" in m and "train/grad_norm" in m for m in steps)


def test_partial_rollouts_resume_from_their_tokens(run):
    resumed = [s for s in run["samples"] if s["metadata"].get("resumes")]
    assert resumed, "no weight update landed during a generation"
    for sample in resumed:
        versions = sample["token_versions"]
        assert versions == sorted(versions)  # prefix kept first: never restarted from scratch
        assert len(versions) == sample["response_length"] == len(sample["rollout_logprobs"])
        # An abort can land before a request made any token (still queued): nothing to keep then.
        if sample["metadata"].get("tokens_kept_on_abort"):
            assert len(set(versions)) >= 2  # the aborted prefix and the continuation on new weights
    assert any(s["metadata"].get("tokens_kept_on_abort") for s in resumed), "no abort kept any token"
    assert sum(m.get("rollout/tokens_kept_on_abort", 0) for m in train_steps(run["metrics"])) > 0


def test_a_raising_reward_function_and_a_bad_row_are_counted_not_fatal(run):
    last = train_steps(run["metrics"])[-1]
    assert last["rollout/reward_errors"] >= 1
    assert last["rollout/bad_rows"] == 1
    assert "line 6" in run["stderr"]  # the malformed row is reported with its line number


def test_the_supervisors_console_carries_no_third_party_warnings(run):
    # megatron-core's Transformer-Engine/Apex notices, torch.distributed's gloo deprecation and
    # torch's C++ "[W..." lines stay off the console; the trainer ranks' own logs keep theirs.
    noise = [line for line in run["stderr"].splitlines()
             if "Warning:" in line or "warnings.warn" in line or line.startswith("[W")]
    assert noise == []


def test_debug_train_only_replays_the_dumped_rollouts_without_engines(run):
    run_dir = run["root"] / "replay"
    argv = [sys.executable, "-m", "actors.loop.cli", "train", "--debug-train-only",
            "--load-debug-rollout-data", str(run["dump"]), "--hf-checkpoint", str(run["model"]),
            "--run-dir", str(run_dir), "--micro-batch-size", "4", "--lr", "1e-4", "--use-tis", "--no-progress-bar",
            # REINFORCE++'s per-token KL reward penalty needs the reference model's logprobs.
            "--advantage-estimator", "reinforce_plus_plus", "--kl-coef", "0.01"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=run["root"])
    assert result.returncode == 0, result.stderr[-4000:]
    assert not (run_dir / "logs" / "engine-0.log").exists()
    replayed = train_steps([json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()])
    assert [m["step"] for m in replayed] == [1, 2, 3, 4, 5]
    assert all("train/grad_norm" in m for m in replayed)


@pytest.fixture(scope="module")
def sync_root(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e-sync")


@pytest.fixture(scope="module")
def sync_broadcast_run(sync_root):
    root = sync_root
    model = build_tiny_model(root / "model", arch="llama", seed=1)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(16)))
    run_dir = root / "run"
    argv = [
        sys.executable, "-m", "actors.loop.cli", "train",
        "--hf-checkpoint", str(model), "--prompt-data", str(data), "--run-dir", str(run_dir),
        "--train-mode", "sync", "--update-weight-transport", "distributed",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "3",
        "--rollout-max-response-len", "16", "--rm-type", "exact", "--engine-type", "cpu",
        "--rollout-num-engines", "2",  # one weight-update group of three ranks: trainer, engine, engine
        "--use-kl-loss", "--kl-loss-coef", "0.01",  # needs the reference model's logprobs every step
        "--micro-batch-size", "4", "--lr", "1e-3", "--no-progress-bar", "--trace-dir", str(root / "trace"),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=root)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sync_mode_trains_only_on_current_policy_tokens(sync_broadcast_run):
    steps = train_steps(sync_broadcast_run)
    assert [m["train/version"] for m in steps] == [1.0, 2.0, 3.0]
    assert all(m["rollout/staleness_max"] == 0 for m in steps)


def test_the_kl_loss_is_computed_against_the_reference_model_every_step(sync_broadcast_run):
    # Without reference logprobs the trainer refuses a KL loss, so the run could not have trained.
    kl = [m["train/kl_loss"] for m in train_steps(sync_broadcast_run)]
    assert len(kl) == 3 and all(value >= 0.0 for value in kl)
    assert kl[0] == pytest.approx(0.0, abs=1e-9)  # step 1 trains the initial weights: policy = reference


def test_broadcast_weights_make_the_engine_serve_exactly_the_trainers_policy(sync_broadcast_run):
    steps = train_steps(sync_broadcast_run)
    # Steps 2 and 3 generate with weights broadcast after steps 1 and 2 (lr 1e-3 changes them):
    # both engines' logprobs must equal the trainer's recompute, as they do before any update.
    assert all(m["train/logprob_abs_diff"] < 1e-4 for m in steps)
    assert all(m["router/engines_up"] == 2 for m in steps)
    served = [v for k, v in steps[-1].items() if k.startswith("router/") and k.endswith("/requests") and k != "router/requests"]
    assert len(served) == 2 and min(served) > 0  # both engines generated
    assert all(m["perf/weight_sync_time"] > 0 for m in steps)


# ----- the --trace-dir timeline (both runs above write one) -------------------------------------------


@pytest.fixture(scope="module")
def sync_trace(sync_broadcast_run, sync_root):
    return sync_root / "trace" / "trace.json"


def timeline(path):
    """The trace's spans as (process, thread, event), after checking every event is well-formed."""
    events = json.loads(path.read_text())["traceEvents"]  # valid JSON, the Chrome object format
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all(e["ts"] >= 0 and e["dur"] >= 0 for e in spans)
    return [(processes[e["pid"]], threads[(e["pid"], e["tid"])], e) for e in spans]


def named(spans, name, process=None):
    return [e for p, _, e in spans if e["name"].startswith(name) and (process is None or p.startswith(process))]


def test_the_trace_has_a_span_per_generation_per_engine_reward_trainer_op_and_buffer_wait(sync_broadcast_run, sync_trace):
    spans = timeline(sync_trace)
    engines = {p for p, _, e in spans if e["name"] == "generate"}
    assert len(engines) == 2 and all(p.startswith("engine 127.0.0.1:") for p in engines)
    requests = sum(m["router/requests"] for m in train_steps(sync_broadcast_run)[-1:])
    assert len(named(spans, "generate")) >= requests  # every request the router had sent by the last step
    assert all({"group", "sample", "completion_tokens", "version"} <= e["args"].keys() for e in named(spans, "generate"))
    assert len(named(spans, "reward")) >= 3 * 2 * 2  # 3 steps x 2 groups x 2 samples, at least
    assert len(named(spans, "train_step", "trainer")) == 3
    assert len(named(spans, "logprobs (ref)", "trainer")) == 3  # the KL loss's reference, every step
    assert [e["name"] for e in named(spans, "step ", "train loop")] == ["step 1", "step 2", "step 3"]
    assert named(spans, "wait for data", "buffer") and named(spans, "wait for admission", "buffer")


def test_the_first_rollout_generates_while_the_trainer_is_still_starting(sync_trace):
    # The engines serve the HF checkpoint the trainer starts from, so step 1's rollout need not wait
    # for the trainer's ranks (seconds of imports and model build on CPU, a minute on a GPU).
    spans = timeline(sync_trace)
    [start] = named(spans, "start", "trainer")
    first = min(e["ts"] for e in named(spans, "generate"))
    assert first < start["ts"] + start["dur"]


def test_each_weight_sync_in_the_trace_holds_its_pause_transfer_and_resume(sync_trace):
    spans = timeline(sync_trace)
    syncs = sorted(named(spans, "weight sync v", "weight sync"), key=lambda e: e["ts"])
    assert [e["args"]["version"] for e in syncs] == [1, 2, 3]
    phases = [e for p, _, e in spans if p == "weight sync" and not e["name"].startswith("weight sync v")]
    for sync in syncs:
        inside = sorted((e for e in phases if sync["ts"] <= e["ts"] and e["ts"] + e["dur"] <= sync["ts"] + sync["dur"]),
                        key=lambda e: e["ts"])
        assert [e["name"] for e in inside] == ["pause", "transfer (distributed)", "resume"]
        assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(inside, inside[1:]))  # one after another


def test_the_fully_async_trace_shows_generation_overlapping_training_and_resumed_requests(run):
    spans = timeline(run["root"] / "trace" / "trace.json")
    generations, steps = named(spans, "generate"), named(spans, "train_step", "trainer")
    assert len(steps) == 5
    assert any(g["ts"] < s["ts"] + s["dur"] and s["ts"] < g["ts"] + g["dur"] for g in generations for s in steps)
    assert any(e["args"]["finish"] == "abort" for e in generations)  # a weight update aborted it ...
    assert any(e["args"]["resumed"] for e in generations)  # ... and it went on from its tokens
    assert {e["name"] for e in named(spans, "transfer")} == {"transfer (disk)"}


def test_the_renderer_draws_the_trace(sync_trace, tmp_path):
    from benchmarks.render_trace import main

    assert main([str(sync_trace), "-o", str(tmp_path / "timeline.png")]) == 0
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
