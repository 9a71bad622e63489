"""The node agent runs process children for the head with the local semantics: readiness on
its node, the log tail on failure, process-group stop, nothing left when the agent or the head
goes away. The agent is a real `slime-async agent` process bound to 127.0.0.2."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from process_tree import DescendantTracker
from slime_async.actor import ActorFailed, spawn
from slime_async.cluster.head import AgentLost, ClusterError, Head, RemoteProcessExited
from slime_async.cluster.nodes import AgentNode, Cluster, LocalNode
from slime_async.cluster.shared_dir import UnsharedDirectory, check_shared_directory
from slime_async.process import ProcessSpec, http_ready
from slime_async.net import free_port

from agent_process import SECOND_NODE

# Serves HTTP on the node's address after writing what the agent put in its environment.
_SERVER = ("import http.server, os, sys; open(sys.argv[1], 'w').write(os.environ['SLIME_NODE_IP'] + ' ' + "
           "os.environ.get('GLOO_SOCKET_IFNAME', '')); "
           "http.server.HTTPServer((os.environ['SLIME_NODE_IP'], int(sys.argv[2])), "
           "http.server.SimpleHTTPRequestHandler).serve_forever()")


async def _head_with_agent(agents, hide: Path | None = None) -> tuple[Head, AgentNode, int]:
    head = Head("127.0.0.1", 0)
    await head.start()
    process = agents(head.address, hide=hide)
    [agent] = await head.wait_for_agents(1, timeout=60)
    return head, AgentNode(1, agent), process.pid


def _server_spec(tmp_path: Path, port: int) -> ProcessSpec:
    return ProcessSpec("server", [sys.executable, "-c", _SERVER, str(tmp_path / "env.txt"), str(port)],
                       ready=http_ready(f"http://{SECOND_NODE}:{port}/"), ready_timeout=30)


async def test_a_remote_child_starts_ready_on_its_node_and_stops(tmp_path, agents):
    head, node, agent_pid = await _head_with_agent(agents)
    tracker = DescendantTracker(agent_pid)
    try:
        assert node.address == SECOND_NODE
        ref = await spawn(node.process(_server_spec(tmp_path, await node.free_port()), tmp_path / "logs"))
        # Ready means the agent's probe passed on its node; the child has the node's address and interface.
        assert (tmp_path / "env.txt").read_text() == f"{SECOND_NODE} lo"
        pid = ref.actor.pid
        assert any(r.pid == pid and r.alive() for r in tracker.recorded())
        await ref.stop()
        assert tracker.wait_all_gone(10) == []
    finally:
        tracker.stop()
        await head.close()


async def test_a_remote_child_that_exits_fails_with_its_log_tail_and_node(tmp_path, agents):
    head, node, _ = await _head_with_agent(agents)
    try:
        spec = ProcessSpec("crasher", [sys.executable, "-c", "import sys, time; time.sleep(0.5); print('boom'); sys.exit(3)"])
        ref = await spawn(node.process(spec, tmp_path / "logs"))
        with pytest.raises(ActorFailed) as failed:
            await ref.wait()
        error = failed.value.error
        assert isinstance(error, RemoteProcessExited) and error.returncode == 3
        assert "boom" in str(error) and SECOND_NODE in str(error)
    finally:
        await head.close()


async def test_killing_the_agent_fails_its_children_and_leaves_no_process(tmp_path, agents):
    head, node, agent_pid = await _head_with_agent(agents)
    tracker = DescendantTracker(agent_pid)
    try:
        ref = await spawn(node.process(_server_spec(tmp_path, await node.free_port()), tmp_path / "logs"))
        await asyncio.sleep(0.5)  # the tracker has seen the child
        os.kill(agent_pid, signal.SIGKILL)
        with pytest.raises(ActorFailed) as failed:
            await asyncio.wait_for(ref.wait(), 20)
        assert isinstance(failed.value.error, AgentLost) and SECOND_NODE in str(failed.value.error)
        assert tracker.wait_all_gone(10) == []
    finally:
        tracker.stop()
        await head.close()


async def test_when_the_head_goes_the_agent_stops_its_children_and_registers_with_the_next(tmp_path, agents):
    port = free_port()
    head = Head("127.0.0.1", port)
    await head.start()
    agent = agents(head.address)
    tracker = DescendantTracker(agent.pid)
    try:
        [connection] = await head.wait_for_agents(1, timeout=60)
        node = AgentNode(1, connection)
        await spawn(node.process(_server_spec(tmp_path, await node.free_port()), tmp_path / "logs"))
        await asyncio.sleep(0.5)
        await head.close()
        assert [r for r in tracker.wait_all_gone(10) if r.pid != agent.pid] == []
        assert agent.poll() is None  # the agent waits for the next head (a restarted run)
        head = Head("127.0.0.1", port)
        await head.start()
        assert len(await head.wait_for_agents(1, timeout=30)) == 1
    finally:
        tracker.stop()
        await head.close()


async def test_a_cluster_without_its_agents_fails_at_start_naming_the_command():
    with pytest.raises(ClusterError, match=r"0 of 1 node agent\(s\) registered .*slime-async agent --head 127\.0\.0\.1:"):
        await Cluster.start(2, node_ip="127.0.0.1", agent_port=0, wait_timeout=0.5)


async def test_a_directory_the_nodes_share_passes_the_probe(tmp_path, agents):
    head, node, _ = await _head_with_agent(agents)
    try:
        await check_shared_directory(tmp_path / "weights", LocalNode(), [("engine E", node)], purpose="P", remedy="R")
    finally:
        await head.close()


async def test_a_directory_another_node_does_not_see_fails_the_probe_naming_engine_and_node(tmp_path, agents):
    unshared = tmp_path / "run"
    unshared.mkdir()
    head, node, _ = await _head_with_agent(agents, hide=unshared)
    try:
        with pytest.raises(UnsharedDirectory) as failed:
            await check_shared_directory(unshared / "weights", LocalNode(), [("engine http://127.0.0.2:1", node)],
                                         purpose="--update-weight-transport disk", remedy="share it")
        message = str(failed.value)
        assert "\n" not in message and message.startswith("--update-weight-transport disk: engine http://127.0.0.2:1 on node 1 (127.0.0.2")
        assert "does not exist there); share it" in message
    finally:
        await head.close()
