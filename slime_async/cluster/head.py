"""The head's end of the agents: where they register, and the children they run for it.

`Head` serves one websocket route; each agent that connects registers its node and then
stays connected for the whole run. The connection *is* the liveness signal: when it drops
(the agent died, its node went away, the network broke: aiohttp's heartbeat notices within
seconds), every child the agent ran fails with `AgentLost`, exactly as a local child fails
with `ProcessExited`, so the supervisors above apply their restart policy unchanged. In the
other direction an agent stops its children as soon as it loses the head.

`RemoteProcessChild` is the actor a supervisor holds for a process an agent runs: the same
lifecycle as `ProcessChild` (start returns once the agent's readiness probe passed, an exit
nobody asked for fails the actor with the log tail from the agent's node, stop stops the
process group there).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from slime_async.actor import Actor
from slime_async.cluster.wire import encode_spec
from slime_async.process import ProcessExited, ProcessSpec, ReadinessTimeout

log = logging.getLogger(__name__)

AGENT_ROUTE = "/agent"
HEARTBEAT_S = 5.0


class AgentLost(RuntimeError):
    """The connection to a node's agent dropped: its children are gone (it stops them)."""


class ClusterError(RuntimeError):
    """The cluster could not be assembled (agents missing, an address that cannot be bound)."""


class RemoteProcessExited(ProcessExited):
    def __init__(self, name: str, node: str, returncode: int | None, log_path: Path, tail: str, exception: str = ""):
        super().__init__(f"{name} on {node}", returncode, log_path, tail, exception)


@dataclass(frozen=True)
class NodeInfo:
    node_ip: str
    hostname: str
    gpus: list[int]
    node_rank: int | None  # as the agent was told (--node-rank / SLURM_NODEID); None: by registration order
    pid: int

    def describe(self) -> str:
        return f"node {self.node_ip} ({self.hostname}, agent pid {self.pid})"


class AgentConnection:
    """One registered agent: requests to it, and the exits of the children it runs."""

    def __init__(self, info: NodeInfo, ws: web.WebSocketResponse, order: int):
        self.info = info
        self.order = order  # registration order, for agents without a node rank
        self._ws = ws
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future] = {}
        self._exits: dict[str, asyncio.Future] = {}
        self._send_lock = asyncio.Lock()
        self.lost: AgentLost | None = None
        self.closed = asyncio.Event()

    async def request(self, op: str, timeout: float | None = None, **payload: Any) -> Any:
        if self.lost is not None:
            raise self.lost
        request_id = next(self._ids)
        reply = asyncio.get_running_loop().create_future()
        self._replies[request_id] = reply
        try:
            async with self._send_lock:
                await self._ws.send_json({"id": request_id, "op": op, **payload})
            async with asyncio.timeout(timeout):
                return await reply
        except ConnectionError as error:
            raise AgentLost(f"agent of {self.info.describe()}: {error}") from None
        finally:
            self._replies.pop(request_id, None)

    def expect_exit(self, child_id: str) -> asyncio.Future:
        exit_future = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            exit_future.set_exception(self.lost)
        self._exits[child_id] = exit_future
        return exit_future

    def forget(self, child_id: str) -> None:
        future = self._exits.pop(child_id, None)
        if future is not None and not future.done():
            future.cancel()

    def _deliver(self, message: dict[str, Any]) -> None:
        if "event" in message:
            future = self._exits.pop(message.get("child", ""), None)
            if future is not None and not future.done():
                future.set_result(message)
            return
        reply = self._replies.get(message.get("id"))
        if reply is not None and not reply.done():
            reply.set_result(message)

    def _lose(self, reason: str) -> None:
        self.lost = AgentLost(f"lost the agent of {self.info.describe()}: {reason}")
        for future in [*self._replies.values(), *self._exits.values()]:
            if not future.done():
                future.set_exception(self.lost)
        self._exits.clear()
        self.closed.set()

    async def close(self) -> None:
        await self._ws.close()


class Head:
    """The websocket server agents register with (``--node-ip``:``--agent-port``)."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = port
        self.agents: list[AgentConnection] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._order = itertools.count()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(AGENT_ROUTE, self._serve_agent)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as error:
            await self._runner.cleanup()
            raise ClusterError(f"the head cannot listen for agents on {self.address} (--node-ip, --agent-port): "
                               f"{error.strerror or error}") from None
        if not self.port:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("waiting for node agents on %s", self.address)

    async def wait_for_agents(self, count: int, timeout: float) -> list[AgentConnection]:
        """The first ``count`` live agents, by node rank then registration order."""
        deadline = time.monotonic() + timeout
        async with self._changed:
            while len(live := [a for a in self.agents if a.lost is None]) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ClusterError(
                        f"{len(live)} of {count} node agent(s) registered within --agent-wait-timeout {timeout:g} s: "
                        f"start `slime-async agent --head {self.address}` on every other node")
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    continue
        ranked = sorted(live, key=lambda a: (a.info.node_rank is None, a.info.node_rank or 0, a.order))
        return ranked[:count]

    async def close(self) -> None:
        for agent in list(self.agents):
            await agent.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _serve_agent(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=64 * 1024 * 1024)
        await ws.prepare(request)
        first = await ws.receive()
        if first.type is not WSMsgType.TEXT or "register" not in (hello := first.json()):
            await ws.close()
            return ws
        info = NodeInfo(**hello["register"])
        agent = AgentConnection(info, ws, next(self._order))
        async with self._changed:
            self.agents.append(agent)
            self._changed.notify_all()
        await ws.send_json({"registered": agent.order})
        log.info("node agent registered: %s", info.describe())
        reason = "its connection closed"
        try:
            async for message in ws:
                if message.type is WSMsgType.TEXT:
                    agent._deliver(message.json())
                elif message.type is WSMsgType.ERROR:
                    reason = f"connection error {ws.exception()}"
        finally:
            agent._lose(reason)
            async with self._changed:
                self.agents.remove(agent)
                self._changed.notify_all()
            log.warning("node agent gone: %s (%s)", info.describe(), reason)
        return ws


class RemoteProcessChild(Actor):
    """A process child that the agent ``agent`` runs on its node."""

    _starts = itertools.count()

    def __init__(self, spec: ProcessSpec, log_dir: str | Path, agent: AgentConnection):
        super().__init__(spec.name)
        self.spec = spec
        self.agent = agent
        self.log_dir = Path(log_dir)
        self.log_path = self.log_dir / f"{spec.name}.log"  # on the agent's node; the agent says where
        self.pid: int | None = None
        self.node_ip = agent.info.node_ip
        self._child_id = f"{spec.name}#{next(self._starts)}"

    async def on_start(self) -> None:
        exited = self.agent.expect_exit(self._child_id)
        try:
            answer = await self.agent.request("start", child=self._child_id, spec=encode_spec(self.spec),
                                              log_dir=str(self.log_dir))
        except BaseException:
            self.agent.forget(self._child_id)
            raise
        if answer.get("log_path"):
            self.log_path = Path(answer["log_path"])
        if not answer["ok"]:
            self.agent.forget(self._child_id)
            if answer.get("error_type") == "ReadinessTimeout":
                raise ReadinessTimeout(f"{answer['error']} (on {self.agent.info.describe()})")
            if answer.get("error_type") == "ProcessExited":
                raise RemoteProcessExited(self.spec.name, self.agent.info.describe(), answer.get("returncode"),
                                          self.log_path, answer.get("tail", ""), answer.get("exception", ""))
            raise RuntimeError(f"starting {self.spec.name!r} on {self.agent.info.describe()} failed: {answer['error']}")
        self.pid = answer["result"]["pid"]
        log.info("started %s on %s (pid %d), log %s", self.spec.name, self.agent.info.describe(), self.pid,
                 self.log_path)
        self.spawn(self._watch_exit(exited), name=f"{self.spec.name}:remote-exit")

    async def _watch_exit(self, exited: asyncio.Future) -> None:
        event = await exited  # AgentLost when the agent goes away: fails this actor
        if event["returncode"] == 0:
            log.info("%s on %s exited with code 0", self.spec.name, self.agent.info.describe())
            self.exit()
            return
        raise RemoteProcessExited(self.spec.name, self.agent.info.describe(), event["returncode"],
                                  Path(event.get("log_path") or self.log_path), event.get("tail", ""),
                                  event.get("exception", ""))

    async def on_stop(self) -> None:
        self.agent.forget(self._child_id)
        if self.agent.lost is None and self.pid is not None:
            try:
                await self.agent.request("stop", child=self._child_id, timeout=self.spec.stop_timeout + 30)
            except (AgentLost, TimeoutError) as error:
                log.warning("stopping %s on %s: %s", self.spec.name, self.agent.info.describe(), error)
