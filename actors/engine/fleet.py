"""The engines of a run: owned ones as supervised process children, external ones by URL."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from actors.engine.config import ROUTED_EXPERTS_ARG, EngineConfig
from actors.engine.external import discover_external_engine
from actors.engine.sglang import assign_engine_gpus, sglang_process_spec
from slime_async.actor import spawn
from slime_async.cluster.nodes import LocalNode, Node
from slime_async.net import free_port
from slime_async.process import ProcessSpec, http_ready
from slime_async.supervisor import ChildSpec
from slime_async.weights.delta.wire import STATE_PATH
from slime_async.weights.process_group import nccl_env_defaults


@dataclass
class Fleet:
    kind: str  # cpu | sglang | external
    urls: list[str]
    children: list[ChildSpec] = field(default_factory=list)  # empty for external engines
    specs: list[ProcessSpec] = field(default_factory=list)  # what each child runs (argv, env)
    nodes: list[Node] = field(default_factory=list)  # where each owned engine runs (parallel to urls)
    # delta transport: owned SGLang engine URL -> the receiver started beside it (on its node)
    delta_receivers: dict[str, str] = field(default_factory=dict)


def cpu_engine_spec(name: str, model_path: str, host: str, port: int, config: EngineConfig, *,
                    policy: bool = True) -> ProcessSpec:
    argv = [sys.executable, "-m", "actors.engine.cpu", "--model-path", model_path, "--host", host,
            "--port", str(port), "--max-running-requests", str(config.cpu_engine_max_running_requests)]
    if policy and config.sglang.get(ROUTED_EXPERTS_ARG):
        argv.append("--enable-return-routed-experts")
    if config.cpu_engine_threads:
        argv += ["--num-threads", str(config.cpu_engine_threads)]
    if config.cpu_engine_strict_preconditions:
        argv.append("--strict-sglang-preconditions")
    return ProcessSpec(name, argv, ready=http_ready(f"http://{host}:{port}/health"),
                       ready_timeout=config.engine_start_timeout)


def delta_receiver_spec(name: str, engine_url: str, model_path: str, host: str, port: int, directory: Path,
                        config: EngineConfig) -> ProcessSpec:
    """The delta weight-sync receiver beside an owned SGLang engine: it rebuilds each version on
    the engine's node and loads it from that node's disk (actors/engine/delta_receiver.py)."""
    argv = [sys.executable, "-m", "actors.engine.delta_receiver", "--engine-url", engine_url,
            "--model-path", model_path, "--dir", str(directory), "--host", host, "--port", str(port)]
    if config.engine_api_key:
        argv += ["--api-key", config.engine_api_key]
    return ProcessSpec(name, argv, ready=http_ready(f"http://{host}:{port}{STATE_PATH}"),
                       ready_timeout=config.engine_start_timeout)


def check_gpu_budget(first_gpu: int, rollout_num_gpus: int, gpu_count: int) -> None:
    """Fail at start when the trainer's GPUs plus the engines' do not fit on this host."""
    if first_gpu + rollout_num_gpus > gpu_count:
        raise ValueError(
            f"the trainer takes GPUs 0..{first_gpu - 1} and --rollout-num-gpus {rollout_num_gpus} more, "
            f"but this host has {gpu_count} GPU(s)"
            if first_gpu else f"--rollout-num-gpus {rollout_num_gpus} but this host has {gpu_count} GPU(s)"
        )


def engine_nodes(nodes: list[Node], rollout_num_nodes: int, engines: int) -> list[Node]:
    """The node of each engine: round-robin over the first --rollout-num-nodes nodes (the head is node 0)."""
    if rollout_num_nodes > len(nodes):
        raise ValueError(f"--rollout-num-nodes {rollout_num_nodes} but the cluster has {len(nodes)} node(s)")
    return [nodes[index % rollout_num_nodes] for index in range(engines)]


async def build_fleet(config: EngineConfig, model_path: str, log_dir: Path, *, gpu_available: bool,
                      first_gpu: int = 0, gpu_count: int = 0, nodes: list[Node] | None = None,
                      trainer_nodes: int = 1, delta_receivers: bool = False) -> Fleet:
    """Decide which engines serve this run; owned ones come back as child specs to supervise.

    SGLang engines take the GPUs from ``first_gpu`` on (the trainer's ranks hold 0..first_gpu-1:
    an engine and the trainer on one GPU could not share an NCCL weight-update group); on nodes
    past the first ``trainer_nodes`` (no trainer ranks there) from GPU 0. With ``nodes`` (a
    multi-node cluster) engines are spread over --rollout-num-nodes of them and listen on their
    node's address; --rollout-num-gpus is then per node. With ``delta_receivers`` (the delta
    transport) each owned SGLang engine gets a receiver child beside it, on its node.
    """
    kind = config.resolved_engine_type(gpu_available, importlib.util.find_spec("sglang") is not None)
    if kind == "external":
        async with aiohttp.ClientSession() as session:
            infos = [await discover_external_engine(url, session, config.engine_api_key)
                     for url in config.rollout_external_engine_addrs]
        return Fleet(kind, [info.url for info in infos])
    nodes = nodes or [LocalNode(config.engine_host)]
    multi_node = len(nodes) > 1
    if kind == "cpu":
        placed = engine_nodes(nodes, config.rollout_num_nodes, config.rollout_num_engines)
        placements = [(None, 1)] * config.rollout_num_engines
    else:
        placed, placements = [], []
        for node in nodes[:config.rollout_num_nodes]:
            node_first = first_gpu if node.rank < trainer_nodes else 0
            check_gpu_budget(node_first, config.rollout_num_gpus, gpu_count if node.gpus is None else len(node.gpus))
            on_node = assign_engine_gpus(config.rollout_num_gpus, config.rollout_num_gpus_per_engine, node_first)
            placed += [node] * len(on_node)
            placements += on_node
    fleet = Fleet(kind, [])
    for index, ((base_gpu, tp_size), node) in enumerate(zip(placements, placed)):
        # One node: --engine-host as before; several: each engine listens on its node's address.
        host = node.address if multi_node else config.engine_host
        if config.engine_base_port:
            port = config.engine_base_port + index
        else:  # free where the engine binds: on its node (through the agent) or at --engine-host here
            port = await node.free_port() if multi_node else free_port(host)
        name = f"engine-{index}"
        if kind == "cpu":
            spec = cpu_engine_spec(name, model_path, host, port, config)
        else:
            spec = sglang_process_spec(name, model_path, host=host, port=port, tp_size=tp_size, base_gpu_id=base_gpu,
                                       passthrough=config.sglang, env=nccl_env_defaults(),
                                       ready_timeout=config.engine_start_timeout)
        url = f"http://{host}:{port}"
        fleet.urls.append(url)
        fleet.specs.append(spec)
        fleet.nodes.append(node)
        # All engines start at once (each has GPUs of its own); a delta receiver, at its turn, after its engine.
        fleet.children.append(ChildSpec(name, _starter(spec, log_dir, node), start_early=True))
        if kind == "sglang" and delta_receivers:
            receiver_port = await node.free_port() if multi_node else free_port(host)
            receiver = delta_receiver_spec(f"delta-receiver-{index}", url, model_path, host, receiver_port,
                                           log_dir.parent / "delta" / name, config)
            fleet.delta_receivers[url] = f"http://{host}:{receiver_port}"
            fleet.children.append(ChildSpec(receiver.name, _starter(receiver, log_dir, node)))
    return fleet


async def build_teacher(config: EngineConfig, kind: str, log_dir: Path, *, first_gpu: int = 0,
                        gpu_count: int = 0) -> tuple[str, list[ChildSpec]]:
    """On-policy distillation's teacher engine: ``(url, children)``. --opd-teacher-url: that server
    (checked to answer, no child); --opd-teacher-hf-checkpoint: one owned engine of it, of ``kind``
    (cpu, or sglang on GPU ``first_gpu``, after the policy's engines), to supervise beside them. It
    is not one of the fleet's URLs, so the router never sends it student traffic and weight syncs
    never reach it."""
    if config.opd_teacher_url:
        async with aiohttp.ClientSession() as session:
            info = await discover_external_engine(config.opd_teacher_url, session, config.engine_api_key)
        return info.url, []
    model_path = config.opd_teacher_hf_checkpoint
    host = config.engine_host
    port = free_port(host)
    if kind == "sglang":
        check_gpu_budget(first_gpu, 1, gpu_count)
        spec = sglang_process_spec("teacher-engine", model_path, host=host, port=port, tp_size=1,
                                   base_gpu_id=first_gpu, env=nccl_env_defaults(),
                                   passthrough={k: v for k, v in config.sglang.items() if k != ROUTED_EXPERTS_ARG},
                                   ready_timeout=config.engine_start_timeout)
    else:
        spec = cpu_engine_spec("teacher-engine", model_path, host, port, config, policy=False)
    return f"http://{host}:{port}", [ChildSpec(spec.name, _starter(spec, log_dir, LocalNode(host)), start_early=True)]


def _starter(spec: ProcessSpec, log_dir: Path, node: Node):
    async def start():
        return await spawn(node.process(spec, log_dir))

    return start
