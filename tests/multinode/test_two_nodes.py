"""A simulated two-node run: the head on 127.0.0.1 and one `slime-async agent` on 127.0.0.2,
with a trainer rank (torchrun's c10d rendezvous, gloo) and a CPU engine on each "node", weights
broadcast from trainer rank 0 to both engines every step. Then the agent is killed: the run
fails with a line naming the lost node (no --max-run-restarts here: restarting the whole run is
the chaos and resume tests' subject, and a second two-node attempt doubled this test's time); no
process of either "node" is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_process import REPO_ROOT, SECOND_NODE, start_agent
from process_tree import DescendantTracker
from slime_async.net import free_port
from examples.models.tiny import build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _trained_steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # being written
            pass
    return [row for row in rows if "train/version" in row]


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-nodes")
    model = build_tiny_model(root / "model", arch="qwen2", seed=0)
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(64)))
    port = free_port()
    agent = start_agent(f"127.0.0.1:{port}", root / "agent.log")
    agents = [agent]
    run_dir, log_path = root / "run", root / "head.log"
    command = [sys.executable, "-m", "actors.loop.cli", "train", "--run-dir", str(run_dir), "--no-progress-bar",
               "--hf-checkpoint", str(model), "--prompt-data", str(data), "--train-mode", "sync",
               "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "4",
               "--rollout-max-response-len", "8", "--rm-type", "exact", "--micro-batch-size", "4", "--lr", "1e-3",
               "--engine-type", "cpu", "--rollout-num-engines", "2", "--rollout-num-nodes", "2",
               "--actor-num-nodes", "2", "--actor-num-procs", "1", "--update-weight-transport", "distributed",
               "--node-ip", "127.0.0.1", "--agent-port", str(port), "--agent-wait-timeout", "60",
               "--trainer-num-threads", "1", "--cpu-engine-threads", "1",
               # A step lasts 1 s more, so the kill lands mid-run.
               "--max-run-restarts", "0", "--train-step-delay", "1"]
    with open(log_path, "wb") as log:
        head = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    trackers = {"head": DescendantTracker(head.pid), "agent": DescendantTracker(agent.pid)}
    try:
        deadline = time.monotonic() + 400
        while len(_trained_steps(run_dir)) < 2:
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no 2 trained steps (exit {head.poll()}):\n{log_path.read_text()[-4000:]}")
            time.sleep(0.2)
        steps = _trained_steps(run_dir)[:2]
        placed = {name: [r.cmdline for r in tracker.recorded() if r.alive()] for name, tracker in trackers.items()}
        before_kill = log_path.read_text()
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait()
        code = head.wait(timeout=300)
        survivors = {name: tracker.wait_all_gone(20) for name, tracker in trackers.items()}
        yield {"steps": steps, "placed": placed, "code": code, "before_kill": before_kill, "log": log_path.read_text(),
               "survivors": survivors, "final_steps": _trained_steps(run_dir)}
    finally:
        for process in (head, *agents):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for tracker in trackers.values():
            tracker.stop()
            tracker.kill_survivors()


def test_each_node_runs_a_trainer_rank_and_an_engine(two_node_run):
    for node in ("head", "agent"):
        commands = two_node_run["placed"][node]
        assert sum("actors.trainer.worker" in c and "torch.distributed.run" not in c for c in commands) == 1, node
        assert sum("actors.engine.cpu" in c for c in commands) == 1, node
    agent_engine = next(c for c in two_node_run["placed"]["agent"] if "actors.engine.cpu" in c)
    assert f"--host {SECOND_NODE}" in agent_engine


def test_the_two_node_group_trains_and_broadcasts_weights_to_both_engines(two_node_run):
    steps = two_node_run["steps"]
    assert [s["train/version"] for s in steps] == [1.0, 2.0]
    assert all("perf/weight_sync_time" in s and "train/grad_norm" in s for s in steps)
    assert "engines not serving the new version" not in two_node_run["before_kill"]


def test_killing_the_agent_fails_the_run_naming_the_node(two_node_run):
    after_kill = two_node_run["log"][len(two_node_run["before_kill"]):]
    failure = next(line for line in after_kill.splitlines() if line.startswith("error: "))
    assert f"lost the agent of node {SECOND_NODE}" in failure
    assert two_node_run["code"] != 0
    assert two_node_run["final_steps"][-1]["step"] < 4  # it did not train on without the node


def test_no_process_of_either_node_survives(two_node_run):
    assert all(survivors == [] for survivors in two_node_run["survivors"].values()), two_node_run["survivors"]
