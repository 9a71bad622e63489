"""Where a multi-node run puts things, and the flags that say so (pure rules, no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from actors.engine.fleet import engine_nodes
from actors.loop.placement import cluster_size
from actors.engine.config import EngineConfig
from actors.loop.run_config import RunConfig, parse_run_config
from actors.trainer.actor import TrainerActor
from actors.megatron.config import TrainerConfig
from agent_process import REPO_ROOT
from slime_async.cluster.addresses import interface_of, node_environment, split_host_port
from slime_async.cluster.nodes import LocalNode
from slime_async.config.flags import ConfigError

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/"]


def test_a_run_needs_the_larger_of_its_trainer_and_engine_node_counts():
    def nodes(engine_type: str = "cpu", **counts: int) -> int:
        engine = EngineConfig(engine_type=engine_type, rollout_num_nodes=counts.get("rollout", 1))
        return cluster_size(RunConfig(trainer=TrainerConfig(actor_num_nodes=counts.get("actor", 1)), engine=engine))

    assert nodes() == 1
    assert nodes(actor=2, rollout=3) == 3 and nodes(actor=2) == 2
    assert nodes("external", rollout=3) == 1  # external engines run wherever their URLs point


def test_engines_go_round_robin_over_the_first_rollout_nodes():
    nodes = [LocalNode("10.0.0.1"), LocalNode("10.0.0.2"), LocalNode("10.0.0.3")]
    assert [n.address for n in engine_nodes(nodes, 2, 5)] == ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.2", "10.0.0.1"]
    with pytest.raises(ValueError, match="--rollout-num-nodes 4 but the cluster has 3 node"):
        engine_nodes(nodes, 4, 1)


def test_a_torchrun_per_node_rendezvouses_through_c10d_at_the_head():
    head, other = LocalNode("10.0.0.1"), LocalNode("10.0.0.2")
    other.rank = 1
    trainer = TrainerActor.__new__(TrainerActor)  # only the argv rule: no torchrun is started
    trainer.nodes, trainer._rendezvous_id = [head, other], "run-1"
    config = TrainerConfig(hf_checkpoint="m")
    assert trainer._rendezvous(config, False, 1, 29500) == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29500",
        "--rdzv-id", "run-1", "--rdzv-conf", "is_host=0", "--local-addr", "10.0.0.2"]
    trainer.nodes = [head]
    assert trainer._rendezvous(config, False, 0, 29500) == [
        "--nnodes", "1", "--master-addr", "10.0.0.1", "--master-port", "29500"]


def test_children_of_a_loopback_node_get_its_address_and_the_loopback_interface():
    assert interface_of("127.0.0.2") == interface_of("127.0.0.1") == "lo"
    env = node_environment("127.0.0.2", {"NCCL_SOCKET_IFNAME": "ib0"})
    # The user's choice (NCCL_SOCKET_IFNAME here) stays.
    assert env == {"SLIME_NODE_IP": "127.0.0.2", "GLOO_SOCKET_IFNAME": "lo", "TP_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize("flags, message", [
    (["--rollout-num-nodes", "0"], "--rollout-num-nodes must be >= 1, got 0"),
    (["--agent-port", "70000"], "--agent-port must be a port number, got 70000"),
    (["--actor-num-nodes", "2", "--advantage-estimator", "ppo"], "--actor-num-nodes > 1 with --advantage-estimator ppo"),
])
def test_bad_placement_flags_fail_at_start_naming_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_run_config([*REQUIRED, *flags])


def test_an_agent_with_a_malformed_head_address_exits_2_with_one_line():
    result = subprocess.run([sys.executable, "-m", "actors.loop.cli", "agent", "--head", "node1"], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == "slime-async agent: error: --head must be HOST:PORT, got 'node1'"


def test_split_host_port():
    assert split_host_port("10.0.0.1:29700", "--head") == ("10.0.0.1", 29700)
    with pytest.raises(ValueError, match="--head must be HOST:PORT, got '10.0.0.1:0'"):
        split_host_port("10.0.0.1:0", "--head")
