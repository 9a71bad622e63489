"""Where a process child runs: this node (`LocalNode`) or a node with an agent (`AgentNode`).

Both answer the same questions, so a launcher places a child without caring which it is:
``address`` (the node's real address: what its children bind to and others dial), ``process``
(the actor for a child there), ``free_port``, and ``read_text`` / ``write_text`` for small
files as that node sees them (configs, the disk transport's probe). `Cluster` is node 0 (the
head) followed by the agents' nodes; it exists for one run attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Protocol

from slime_async.actor import Actor
from slime_async.cluster.addresses import LOOPBACK, detect_node_ip, node_environment
from slime_async.cluster.head import AgentConnection, Head, RemoteProcessChild
from slime_async.net import free_port
from slime_async.process import ProcessChild, ProcessSpec


class Node(Protocol):
    rank: int
    address: str
    gpus: list[int] | None  # None: whatever this process sees

    def process(self, spec: ProcessSpec, log_dir: str | Path) -> Actor: ...

    async def free_port(self) -> int: ...

    async def read_text(self, path: str | Path) -> str | None: ...

    async def write_text(self, path: str | Path, text: str) -> None: ...

    def describe(self) -> str: ...


class LocalNode:
    """The head's own node. ``multi_node``: children get the node's address and interface in
    their environment (on a single host they keep their defaults)."""

    rank = 0
    gpus = None

    def __init__(self, address: str = LOOPBACK, multi_node: bool = False):
        self.address = address
        self.multi_node = multi_node

    def process(self, spec: ProcessSpec, log_dir: str | Path) -> Actor:
        if self.multi_node:
            spec = dataclasses.replace(spec, env={**spec.env, **node_environment(self.address, dict(os.environ))})
        return ProcessChild(spec, log_dir)

    async def free_port(self) -> int:
        return free_port(self.address)

    async def read_text(self, path: str | Path) -> str | None:
        try:
            return await asyncio.to_thread(Path(path).read_text)
        except OSError:
            return None

    async def write_text(self, path: str | Path, text: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(Path(path).write_text, text)

    def describe(self) -> str:
        return f"node 0 ({self.address}, the head)"


class AgentNode:
    def __init__(self, rank: int, agent: AgentConnection, timeout: float = 60.0):
        self.rank = rank
        self.agent = agent
        self.address = agent.info.node_ip
        self.gpus = list(agent.info.gpus)
        self.timeout = timeout

    def process(self, spec: ProcessSpec, log_dir: str | Path) -> Actor:
        return RemoteProcessChild(spec, log_dir, self.agent)

    async def free_port(self) -> int:
        return await self._result("free_port", host=self.address)

    async def read_text(self, path: str | Path) -> str | None:
        return await self._result("read_file", path=str(path))

    async def write_text(self, path: str | Path, text: str) -> None:
        await self._result("write_file", path=str(path), text=text)

    async def _result(self, op: str, **payload):
        answer = await self.agent.request(op, timeout=self.timeout, **payload)
        if not answer["ok"]:
            raise RuntimeError(f"{op} on {self.describe()}: {answer['error']}")
        return answer["result"]

    def describe(self) -> str:
        return f"node {self.rank} ({self.address}, agent pid {self.agent.info.pid})"


class Cluster:
    """The nodes of one run attempt: the head's, then one per registered agent."""

    def __init__(self, nodes: list[Node], head: Head | None = None):
        self.nodes = nodes
        self.head = head

    @property
    def multi_node(self) -> bool:
        return len(self.nodes) > 1

    @classmethod
    async def start(cls, node_count: int, *, node_ip: str | None, agent_port: int, wait_timeout: float) -> Cluster:
        """One node: just this one (loopback unless --node-ip). More: listen for agents on this
        node's address and wait until ``node_count - 1`` of them registered."""
        if node_count <= 1:
            return cls([LocalNode(node_ip or LOOPBACK)])
        address = node_ip or detect_node_ip()
        head = Head(address, agent_port)
        await head.start()
        try:
            agents = await head.wait_for_agents(node_count - 1, wait_timeout)
        except BaseException:
            await head.close()
            raise
        nodes: list[Node] = [LocalNode(address, multi_node=True)]
        nodes += [AgentNode(rank, agent) for rank, agent in enumerate(agents, start=1)]
        return cls(nodes, head)

    async def close(self) -> None:
        if self.head is not None:
            await self.head.close()
