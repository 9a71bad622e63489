"""``slime-async agent --head HOST:PORT [--node-ip IP] [--gpus 0,1] [--node-rank R]``: one per node but the head.

It registers this node with the head, then starts, watches and stops process children for
the head's supervisors with the local child semantics (`slime_async.process.ProcessChild`:
readiness probe, log file and its tail on failure, process-group stop, PR_SET_PDEATHSIG so
nothing outlives the agent). Each child gets this node's address and network interface in
its environment (`addresses.node_environment`).

When the head goes away (its run ended, failed, or was killed) the agent stops every child at
once and waits for a head again, so a run that restarts (``--max-run-restarts``) finds it;
after ``--reconnect-timeout`` s without a head it exits. SIGTERM/SIGINT stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from slime_async.actor import ActorFailed, ActorRef, spawn
from slime_async.cluster.addresses import detect_node_ip, node_environment, split_host_port
from slime_async.cluster.head import AGENT_ROUTE, HEARTBEAT_S
from slime_async.cluster.wire import decode_spec
from slime_async.net import free_port
from slime_async.exception_text import log_exception, log_window
from slime_async.process import ProcessChild, ProcessExited, ReadinessTimeout, log_tail

log = logging.getLogger("slime_async.agent")

_MAX_FILE_BYTES = 1 << 20  # read_file/write_file carry small files (configs, probes), not weights


class _Session:
    """One connection to a head: the children started through it die with it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, node_ip: str, fallback_log_dir: Path):
        self.ws = ws
        self.node_ip = node_ip
        self.fallback_log_dir = fallback_log_dir
        self.children: dict[str, ActorRef] = {}
        self.stopping: set[str] = set()
        self.tasks: set[asyncio.Task] = set()
        self._send_lock = asyncio.Lock()

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            if not self.ws.closed:
                await self.ws.send_json(message)

    def handle(self, message: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"id": message["id"]}
        try:
            reply.update(await getattr(self, f"_op_{message['op']}")(message))
        except Exception as error:  # noqa: BLE001 - every failure goes back to the head
            reply.update(ok=False, error=f"{type(error).__name__}: {error}", error_type=type(error).__name__)
        await self.send(reply)

    # ----- operations ----------------------------------------------------------------------------
    async def _op_start(self, message: dict[str, Any]) -> dict[str, Any]:
        child_id = message["child"]
        spec = decode_spec(message["spec"], node_environment(self.node_ip, dict(os.environ)))
        log_dir = _writable_dir(Path(message["log_dir"]), self.fallback_log_dir)
        process = ProcessChild(spec, log_dir)
        try:
            ref = await spawn(process)
        except ProcessExited as error:
            return {"ok": False, "error": str(error), "error_type": "ProcessExited", "returncode": error.returncode,
                    "log_path": str(process.log_path), "tail": log_tail(process.log_path),
                    "exception": error.exception}
        except ReadinessTimeout as error:
            return {"ok": False, "error": str(error), "error_type": "ReadinessTimeout",
                    "log_path": str(process.log_path)}
        self.children[child_id] = ref
        watcher = asyncio.get_running_loop().create_task(self._watch(child_id, ref, process))
        self.tasks.add(watcher)
        watcher.add_done_callback(self.tasks.discard)
        log.info("started %s (pid %d) for the head", spec.name, process.pid)
        return {"ok": True, "result": {"pid": process.pid}, "log_path": str(process.log_path)}

    async def _watch(self, child_id: str, ref: ActorRef, process: ProcessChild) -> None:
        returncode: int | None = 0
        try:
            await ref.wait()
        except ActorFailed as failed:
            error = failed.error
            returncode = error.returncode if isinstance(error, ProcessExited) else None
        self.children.pop(child_id, None)
        if child_id in self.stopping:
            return
        # The child's own exception is read here, where its log is (the head may not see this disk).
        await self.send({"event": "exited", "child": child_id, "returncode": returncode,
                         "log_path": str(process.log_path), "tail": log_tail(process.log_path),
                         "exception": log_exception(log_window(process.log_path))})

    async def _op_stop(self, message: dict[str, Any]) -> dict[str, Any]:
        child_id = message["child"]
        self.stopping.add(child_id)
        ref = self.children.pop(child_id, None)
        if ref is not None:
            await ref.stop()
        return {"ok": True, "result": None}

    async def _op_free_port(self, message: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "result": free_port(message.get("host") or self.node_ip)}

    async def _op_read_file(self, message: dict[str, Any]) -> dict[str, Any]:
        path = Path(message["path"])
        try:
            with open(path, "rb") as handle:
                data = handle.read(_MAX_FILE_BYTES)
        except OSError:
            return {"ok": True, "result": None}
        return {"ok": True, "result": data.decode("utf-8", "replace")}

    async def _op_write_file(self, message: dict[str, Any]) -> dict[str, Any]:
        path = Path(message["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message["text"])
        return {"ok": True, "result": None}

    async def close(self) -> None:
        """Stop every child (in parallel: each may take its SIGTERM grace period)."""
        self.stopping.update(self.children)
        children, self.children = list(self.children.values()), {}
        await asyncio.gather(*(ref.stop() for ref in children), return_exceptions=True)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _writable_dir(preferred: Path, fallback: Path) -> Path:
    """The head's log directory where this node shares its filesystem, else the agent's own."""
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


async def run_agent(head: str, node_ip: str, gpus: list[int], node_rank: int | None, log_dir: Path,
                    reconnect_timeout: float, stop: asyncio.Event) -> int:
    """Serve heads until ``stop`` is set (0) or no head answered for ``reconnect_timeout`` s (1)."""
    url = f"http://{head}{AGENT_ROUTE}"
    hello = {"register": {"node_ip": node_ip, "hostname": socket.gethostname(), "gpus": gpus,
                          "node_rank": node_rank, "pid": os.getpid()}}
    last_contact = time.monotonic()
    announced = False
    async with aiohttp.ClientSession() as client:
        while not stop.is_set():
            try:
                ws = await client.ws_connect(url, heartbeat=HEARTBEAT_S, max_msg_size=64 * 1024 * 1024)
            except (aiohttp.ClientError, OSError) as error:
                if time.monotonic() - last_contact > reconnect_timeout:
                    log.error("no head at %s for %g s (%s): exiting", head, reconnect_timeout, error)
                    return 1
                if not announced:
                    log.info("waiting for the head at %s", head)
                    announced = True
                await _sleep_or(stop, 0.5)
                continue
            session = _Session(ws, node_ip, log_dir)
            try:
                await ws.send_json(hello)
                log.info("registered %s with the head at %s", node_ip, head)
                stopped = asyncio.create_task(stop.wait())
                try:
                    while True:
                        received = asyncio.create_task(ws.receive())
                        await asyncio.wait([received, stopped], return_when=asyncio.FIRST_COMPLETED)
                        if not received.done():
                            received.cancel()
                            break
                        message = received.result()
                        if message.type is not aiohttp.WSMsgType.TEXT:
                            break
                        data = message.json()
                        if "op" in data:
                            session.handle(data)
                finally:
                    stopped.cancel()
            finally:
                # No child outlives its head's connection: a new head starts its own.
                await session.close()
                await ws.close()
                last_contact = time.monotonic()
                announced = False
            if not stop.is_set():
                log.warning("lost the head at %s: stopped its children; waiting for a head again", head)
    return 0


async def _sleep_or(event: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        pass


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="slime-async agent", description="Run process children (trainer ranks, engines) on this node for a "
        "slime-async head on another: one agent per node but the head (docs/multi-node.md).")
    parser.add_argument("--head", required=True, help="HOST:PORT the head listens on for agents (its --node-ip and --agent-port)")
    parser.add_argument("--node-ip", default=None, help="this node's address, the one other nodes reach it at "
                        "(default: the address of the route to the head)")
    parser.add_argument("--gpus", default=None, help="GPU ids this node offers, comma-separated (default: all visible)")
    parser.add_argument("--node-rank", type=int, default=None, help="orders the agents' nodes after the head's "
                        "(node 0); default: $SLURM_NODEID, else the order of registration")
    parser.add_argument("--log-dir", default="agent-logs", help="child logs when the head's run directory is not "
                        "shared with this node")
    parser.add_argument("--reconnect-timeout", type=float, default=600.0,
                        help="exit after this many seconds without a head")
    return parser.parse_args(argv)


def _visible_gpus(spec: str | None) -> list[int]:
    """--gpus, else CUDA_VISIBLE_DEVICES, else the NVIDIA device files (importing torch to count
    them would take the agent seconds to start)."""
    spec = spec if spec is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is not None:
        try:
            return [int(gpu) for gpu in spec.split(",") if gpu.strip()]
        except ValueError:
            raise ValueError(f"--gpus must be comma-separated GPU ids, got {spec!r}") from None
    return sorted(int(p.name[6:]) for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s agent: %(message)s")
    try:
        head_host, head_port = split_host_port(args.head, "--head")
        gpus = _visible_gpus(args.gpus)
    except ValueError as error:
        print(f"slime-async agent: error: {error}", file=sys.stderr)
        return 2
    node_ip = args.node_ip or detect_node_ip(head_host)
    node_rank = args.node_rank
    if node_rank is None and os.environ.get("SLURM_NODEID", "").isdigit():
        node_rank = int(os.environ["SLURM_NODEID"])

    async def serve() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await run_agent(f"{head_host}:{head_port}", node_ip, gpus, node_rank, Path(args.log_dir).resolve(),
                               args.reconnect_timeout, stop)

    return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
