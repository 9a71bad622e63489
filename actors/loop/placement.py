"""Which nodes a run needs, and the multi-node pieces of its launch (slime_async.cluster).

The head is node 0; ``--actor-num-nodes`` and ``--rollout-num-nodes`` count it, so a run needs
as many nodes as the larger of the two (owned engines only: external ones run wherever their
URLs point), and the head waits for one agent per node beyond its own.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from actors.engine.fleet import Fleet
from actors.loop.run_config import RunConfig
from slime_async.actor import ActorRef
from slime_async.cluster.addresses import node_environment
from slime_async.cluster.head import ClusterError
from slime_async.cluster.nodes import Cluster
from slime_async.cluster.shared_dir import check_shared_directory
from slime_async.runtime import EXIT_FAILURE, report_error


def cluster_size(config: RunConfig) -> int:
    trainer_nodes = 1 if config.train.debug_rollout_only else config.trainer.actor_num_nodes
    engine_nodes = 1 if config.train.debug_train_only or config.engine.engine_type == "external" \
        else config.engine.rollout_num_nodes
    return max(trainer_nodes, engine_nodes)


async def in_cluster(config: RunConfig, main: Callable[[Cluster], Awaitable[int]]) -> int:
    """``main(cluster)`` with this attempt's nodes; agents that do not come fail it with one line."""
    try:
        cluster = await Cluster.start(cluster_size(config), node_ip=config.cluster.node_ip,
                                      agent_port=config.cluster.agent_port,
                                      wait_timeout=config.cluster.agent_wait_timeout)
    except ClusterError as error:
        report_error(str(error))
        return EXIT_FAILURE
    if cluster.multi_node:
        # The supervisor's own RPC endpoint (TensorPipe) must listen where the other nodes' ranks dial.
        os.environ.update({k: v for k, v in node_environment(cluster.nodes[0].address, dict(os.environ)).items()
                           if k == "TP_SOCKET_IFNAME"})
    try:
        return await main(cluster)
    finally:
        await cluster.close()


def export_dir_check(cluster: Cluster, fleet: Fleet, trainer: ActorRef, weights_dir: Path
                     ) -> Callable[[], Awaitable[None]] | None:
    """For the disk transport on several nodes: every owned engine's node must read what trainer
    rank 0's node writes under ``weights_dir`` (external engines have no agent to ask)."""
    if not cluster.multi_node or not fleet.nodes:
        return None

    async def check() -> None:
        address, _ = await trainer.ask("weight_master")
        writer = next((node for node in cluster.nodes if node.address == address), cluster.nodes[0])
        await check_shared_directory(
            weights_dir, writer, [(f"engine {url}", node) for url, node in zip(fleet.urls, fleet.nodes)],
            purpose="--update-weight-transport disk",
            remedy="put --run-dir on a filesystem every node mounts, or use --update-weight-transport distributed")

    return check
