"""`TrainerActor`: the supervisor's handle on the torchrun groups of Megatron ranks.

It owns the torchrun processes (one per node for the policy, one for PPO's critic) and the RPC
bridge. Every operation is sent to all ranks of a group (SPMD), each with its DP shard, and
awaited without blocking the event loop. A group's operations are serialised by its lock:
collectives must be issued in the same order on every rank, and two concurrent ops could
reach two ranks in different orders.

Failure: each torchrun, with a watch of its ranks' pids, is a child (`TorchrunGroup`) of a
supervisor that starts them in order and stops them in reverse. When a rank or a torchrun dies,
every pending call fails at once with `TrainerRankDied` (rank, pid, log tail), the supervisor
stops the other groups, and the actor fails with that error: its own supervisor learns of it.

Call the handlers through ``ask`` with a timeout fit for the work (``timeout=None`` for
training); they answer through ``defer``, so the mailbox stays free meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from actors.megatron.config import TrainerConfig
from actors.megatron.dp_split import split_across_dp, split_into_global_batches
from actors.megatron.protocol import RankInfo
from actors.trainer import worker
from actors.trainer.protocol import SampleLogprobs
from actors.trainer.torchrun import DEATH_REPORT_GRACE, WATCH_INTERVAL, TorchrunGroup, TrainerRankDied
from slime_async.weights.protocol import WeightGroupSpec
from policies.algorithm import AlgorithmConfig
from policies.requirements import needs_old_logprobs
from slime_async.actor import Actor, ActorFailed, ActorRef, Deferred, spawn
from slime_async.child_env import PACKAGES_ROOT, child_pythonpath
from slime_async.batch import Batch
from slime_async.cluster.nodes import LocalNode, Node
from slime_async.process import ProcessChild, ProcessSpec, log_tail
from slime_async.rpc import RpcBridge, RpcError
from slime_async.supervisor import ChildSpec, Restart, Supervisor
from slime_async.task_group import gather_or_cancel, task_group
from slime_async.trace import TraceRecorder
from slime_async.net import free_port
from slime_async.weights.process_group import nccl_env_defaults

log = logging.getLogger(__name__)


def _op_name(op: str, kwargs: dict[str, Any]) -> str:
    """An op's span on the timeline: compute_logprobs names its model (actor = π_old, ref = π_ref)."""
    return f"logprobs ({kwargs.get('model', 'actor')})" if op == "compute_logprobs" else op


def _op_args(per_rank: Sequence[tuple] | None) -> dict[str, Any]:
    """What the span shows of an op's arguments: the samples of a batch op (all DP shards; TP/PP
    peers hold the same shard object)."""
    shards = {id(args[0]): len(args[0]) for args in per_rank or () if args and isinstance(args[0], Batch)}
    return {"samples": sum(shards.values())} if shards else {}


# Metrics of a rollout's optimizer steps that are not averaged: counters add up, the step is the last.
_SUMMED_STEP_METRICS = ("num_micro_batches", "step_time_s")
_LAST_STEP_METRICS = ("step", "skipped_steps", "memory_peak_allocated_gb", "memory_peak_reserved_gb")  # running values (ops.py)


def mean_step_metrics(per_step: Sequence[dict[str, float]]) -> dict[str, float]:
    """One rollout's metrics from those of its optimizer steps: the mean of each (the clip fraction
    and ppo_kl of the later steps are where π_θ has moved from π_old), counters summed, the trainer's
    step counter of the last step, and num_optimizer_steps."""
    keys = sorted({key for metrics in per_step for key in metrics})
    merged: dict[str, float] = {}
    for key in keys:
        values = [metrics[key] for metrics in per_step if key in metrics]
        if key in _LAST_STEP_METRICS:
            merged[key] = values[-1]
        elif key in _SUMMED_STEP_METRICS:
            merged[key] = float(sum(values))
        else:
            merged[key] = float(sum(values) / len(values))
    merged["num_optimizer_steps"] = float(len(per_step))
    return merged


def _gpus_after(first: int, count: int) -> str:
    """CUDA_VISIBLE_DEVICES for ``count`` GPUs from the ``first``-th of those this process sees."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if first + count > len(ids):
        raise ValueError(f"the critic needs GPUs {first}..{first + count - 1}, but {len(ids)} are visible")
    return ",".join(ids[first:first + count])


@dataclasses.dataclass
class _Group:
    """The ranks of one model: the policy's, or PPO's value model (its own torchrun, in the policy's
    RPC world: torch's RPC agent is process-wide, so the supervisor has one bridge for both)."""

    role: str  # the worker's --role: "actor" (the policy) or "critic"
    config: TrainerConfig
    num_ranks: int
    ranks: list[RankInfo] = dataclasses.field(default_factory=list)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # the two groups' ops may overlap


class TrainerActor(Actor):
    """``critic``: the trainer section of PPO's value model (actors.critic), started as a second
    torchrun group with the same readiness, log capture and failure reporting as the policy's;
    either group's death fails the actor."""

    def __init__(self, config: TrainerConfig, log_dir: str | Path, name: str = "trainer",
                 critic: TrainerConfig | None = None, critic_first_gpu: int = 0, nodes: Sequence[Node] | None = None,
                 trace: TraceRecorder | None = None):
        super().__init__(name)
        self.config = config.validate()
        # One torchrun per node, the head's first (slime_async.cluster): node k runs node rank k.
        self.nodes = list(nodes or [LocalNode()])[:config.actor_num_nodes]
        if len(self.nodes) < config.actor_num_nodes:
            raise ValueError(f"--actor-num-nodes {config.actor_num_nodes} but the cluster has {len(self.nodes)} node(s)")
        self._rendezvous_id = ""
        self.log_dir = Path(log_dir)
        cuda = torch.cuda.is_available()
        self.policy = _Group("actor", self.config, config.num_ranks(cuda) * config.actor_num_nodes)
        self.critic = (_Group("critic", critic.validate(), critic.num_ranks(cuda) * critic.actor_num_nodes)
                       if critic is not None else None)
        self.critic_first_gpu = critic_first_gpu  # on GPU: 0 shares the policy's GPUs
        self.bridge: RpcBridge | None = None
        self._groups: ActorRef | None = None  # the supervisor of the torchruns
        self._trace = trace or TraceRecorder.off()  # --trace-dir: each op on the ranks is a span
        self._death: TrainerRankDied | None = None  # the first group's death: every later call raises it
        self._died = asyncio.Event()

    @property
    def num_ranks(self) -> int:
        return self.policy.num_ranks

    @property
    def ranks(self) -> list[RankInfo]:
        return self.policy.ranks

    # ----- lifecycle -------------------------------------------------------------------------
    @property
    def _rpc_world_size(self) -> int:
        return self.num_ranks + (self.critic.num_ranks if self.critic else 0) + 1

    def _rendezvous(self, config: TrainerConfig, critic: bool, node_rank: int, port: int) -> list[str]:
        """torchrun's rendezvous flags: one node as before; several through c10d at the head, each
        torchrun binding its node's address (``--local-addr``), the head's hosting the store."""
        if len(self.nodes) == 1 or critic:
            return ["--nnodes", "1", "--master-addr", self.nodes[0].address, "--master-port", str(port)]
        return ["--nnodes", str(len(self.nodes)), "--node-rank", str(node_rank), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"{self.nodes[0].address}:{port}", "--rdzv-id", self._rendezvous_id,
                "--rdzv-conf", f"is_host={int(node_rank == 0)}", "--local-addr", self.nodes[node_rank].address]

    def _spec(self, rpc_port: int, role: str = "actor", node_rank: int = 0, rendezvous_port: int = 0) -> ProcessSpec:
        # torchrun runs in the repository root, not the user's directory: every path it gets is absolute.
        critic = role == "critic"
        config = self.critic.config if critic and self.critic else self.config
        config_path = (self.log_dir / f"{self.name}{'_critic' if critic else ''}_config.json").resolve()
        config_path.write_text(config.with_absolute_paths().to_json())
        argv = [
            sys.executable, "-m", "torch.distributed.run",
            "--nproc-per-node", str(config.num_ranks(torch.cuda.is_available())),
            # The critic's group never shares the policy's rendezvous port.
            *self._rendezvous(config, critic, node_rank, (None if critic else rendezvous_port or config.master_port)
                              or free_port(self.nodes[0].address)),
            "-m", "actors.critic.worker" if critic else "actors.trainer.worker",
            "--rpc-init-method", f"tcp://{self.nodes[0].address}:{rpc_port}",
            "--rpc-world-size", str(self._rpc_world_size),
            "--config-json", str(config_path),
            "--rpc-timeout", str(config.trainer_start_timeout),
            # RPC rank 0 is the supervisor, then the policy's ranks, then the critic's.
            "--rpc-rank-offset", str(1 + (self.num_ranks if critic else 0)),
        ]
        pythonpath = child_pythonpath()
        env = {"PYTHONPATH": pythonpath, **nccl_env_defaults()}
        if self.config.trainer_num_threads:
            env["OMP_NUM_THREADS"] = str(self.config.trainer_num_threads)
        if critic and torch.cuda.is_available():
            # A rank takes GPU LOCAL_RANK of those it sees: the critic's see theirs from critic_first_gpu.
            env["CUDA_VISIBLE_DEVICES"] = _gpus_after(self.critic_first_gpu, config.num_ranks(True))
        node = f"-node{node_rank}" if node_rank else ""
        return ProcessSpec(name=f"{self.name}{'-critic' if critic else ''}-torchrun{node}", argv=argv, env=env,
                           cwd=str(PACKAGES_ROOT))

    async def on_start(self) -> None:
        started = self._trace.now()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        head = self.nodes[0]
        rpc_port = free_port(head.address)
        self._rendezvous_id = f"{self.name}-{os.getpid()}-{rpc_port}"
        rendezvous_port = self.config.master_port or free_port(head.address)
        # Every spec first: a critic that cannot be placed fails before anything is started.
        # Ranks on other nodes are watched through their node's torchrun (their pids are not ours).
        children = [self._child(head, self._spec(rpc_port, rendezvous_port=rendezvous_port), "trainer",
                                lambda: [info for info in self.ranks if info.node_ip in ("", head.address)])]
        children += [self._child(node, self._spec(rpc_port, node_rank=node.rank, rendezvous_port=rendezvous_port),
                                 "trainer", lambda: ()) for node in self.nodes[1:]]
        if self.critic is not None:
            children.append(self._child(None, self._spec(rpc_port, "critic"), "critic", lambda: self.critic.ranks))
        # Started in order, stopped in reverse, never restarted (intensity 0): one restarted group
        # cannot re-join the RPC world and the rendezvous the others are in, so the end of any
        # group escalates: this actor fails, and the run restarts from its checkpoint
        # (--max-run-restarts).
        self._groups = await spawn(Supervisor(f"{self.name}-groups", children, max_restarts=0))
        self.bridge = RpcBridge(f"tcp://{head.address}:{rpc_port}", self._rpc_world_size,
                                start_timeout=self.config.trainer_start_timeout)
        try:
            await self._join()
            self.policy.ranks = sorted(await self._all("info"), key=lambda info: info.rank)
            if self.critic is not None:
                self.critic.ranks = sorted(await self._all("info", role="critic"), key=lambda info: info.rank)
        except BaseException:
            await self.on_stop()
            raise
        log.info("trainer ready: %d ranks, dp=%d tp=%d pp=%d", self.num_ranks, self.dp_size, self.ranks[0].tp_size, self.ranks[0].pp_size)
        # In the trace, what the first rollout overlaps (actors/loop/launch.py: rollout_starts_with_trainer).
        lane = self._trace.lane(worker.rpc_prefix(self.policy.role), "ranks")
        self._trace.record("start", lane, started, cat="start", ranks=self.num_ranks)
        self.spawn(self._escalate(), name=f"{self.name}:groups")

    def _child(self, node: Node | None, spec: ProcessSpec, group: str,
               ranks: Callable[[], Sequence[RankInfo]]) -> ChildSpec:
        """A torchrun on ``node`` (None: the critic's, on the head) as a child of the groups' supervisor."""

        async def start() -> ActorRef:
            if node is not None and node.rank:
                # The rank config travels to the node: its filesystem need not be the head's.
                config_path = spec.argv[spec.argv.index("--config-json") + 1]
                await node.write_text(config_path, Path(config_path).read_text())
            process = node.process(spec, self.log_dir) if node is not None else ProcessChild(spec, self.log_dir)
            return await spawn(TorchrunGroup(process, group, ranks, self._report_death))

        return ChildSpec(spec.name, start, Restart.PERMANENT)

    async def _join(self) -> None:
        """Join the RPC world, unless a group dies first (then its report) or the start times out."""
        try:
            async with asyncio.timeout(self.config.trainer_start_timeout), task_group() as tasks:
                death = tasks.create_task(self._dead())
                await self.bridge.start()
                death.cancel()
        except TimeoutError:
            logs = [ref.actor.process.log_path for ref in self._groups.actor.children().values()]
            tails = "\n".join(f"last lines of {path}:\n{log_tail(path)}" for path in logs)
            raise TimeoutError(f"trainer ranks did not start within --trainer-start-timeout "
                               f"{self.config.trainer_start_timeout:g} s; {tails}") from None

    def _report_death(self, death: TrainerRankDied) -> None:
        """From a group's watch, before its supervisor hears of it: every pending call fails now."""
        if self._death is None:
            self._death = death
            self._died.set()
            if self.bridge is not None:
                self.bridge.fail_pending(death)

    async def _dead(self) -> None:
        """Raise the first group's death once there is one."""
        await self._died.wait()
        raise self._death

    async def _escalate(self) -> None:
        """Fail with the dead group's report once its supervisor has stopped the others."""
        try:
            await self._groups.wait()
        except ActorFailed as failed:
            raise (self._death or failed.error) from None
        raise RuntimeError(f"the torchrun groups of {self.name!r} stopped")  # only on_stop stops them

    @property
    def dp_size(self) -> int:
        return self.ranks[0].dp_size

    async def on_stop(self) -> None:
        """Leave the RPC group, then stop the groups (their supervisor: in reverse start order,
        each torchrun with SIGTERM to its process group, then SIGKILL).

        Ranks are not asked to exit over RPC: a graceful RPC shutdown is a barrier whose
        bookkeeping only matches on a process's first RPC group (a restarted trainer would
        hang in it), and ranks hold no state a checkpoint did not already write.
        """
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.fail_pending(RuntimeError(f"the trainer {self.name!r} is stopping"))
            await bridge.shutdown(graceful=False)
        if self._groups is not None:
            await self._groups.stop()

    # ----- RPC plumbing --------------------------------------------------------------------------
    async def _all(self, op: str, *args: Any, per_rank: Sequence[tuple] | None = None, role: str = "actor",
                   **kwargs: Any) -> list[Any]:
        """Run ``op`` on every rank of ``role``'s group, "actor" (the policy) or "critic" (rank r
        gets ``per_rank[r]`` as args when given). The first failure cancels the other ranks'
        calls; a transport error (a peer gone) becomes the report that names the dead rank."""
        group = self.critic if role == "critic" else self.policy
        if group is None:
            raise ValueError(f"critic op {op!r}, but this trainer has no critic (--advantage-estimator ppo)")
        lane = self._trace.lane(worker.rpc_prefix(group.role), "ranks")
        async with group.lock, self._trace.span(_op_name(op, kwargs), lane, cat="train", op=op, **_op_args(per_rank)):
            try:
                return await gather_or_cancel(*(
                    self._call(group, r, op, *(per_rank[r] if per_rank is not None else args), **kwargs)
                    for r in range(group.num_ranks)
                ))
            except RpcError as error:
                # The transport may notice a dead peer ("eof") before the group's watch does; the
                # caller should get the report that names the rank, so wait for it briefly.
                try:
                    async with asyncio.timeout(DEATH_REPORT_GRACE + 2 * WATCH_INTERVAL + 1.0):
                        await self._dead()
                except TimeoutError:
                    raise error from None

    async def _call(self, group: _Group, rank: int, op: str, *args: Any, **kwargs: Any) -> Any:
        if self._death is not None:
            raise self._death
        assert self.bridge is not None
        return await self.bridge.call(f"{worker.rpc_prefix(group.role)}{rank}", worker.call, op, *args,
                                      timeout=self.config.op_timeout, **kwargs)

    def _shard(self, batch: Batch, ranks: Sequence[RankInfo] | None = None) -> tuple[list[list[int]], list[tuple]]:
        """DP bins of sample indices and each rank's shard (TP/PP peers share their DP shard);
        ``ranks``: another group's (the critic's) instead of the policy's."""
        ranks = self.ranks if ranks is None else ranks
        bins = split_across_dp(batch.lengths, ranks[0].dp_size)
        shards = [batch.select(b) for b in bins]
        return bins, [(shards[info.dp_rank],) for info in ranks]

    # ----- operations (answered through defer) -----------------------------------------------------
    def train_step(self, batch: Batch, loss_spec: AlgorithmConfig, *, max_response_len: int | None = None) -> Deferred:
        """Train on one rollout's ``batch``: len(batch) / --global-batch-size optimizer steps (one when
        unset), on consecutive global batches. Before the first of several steps, π_old is recomputed
        for the whole batch (unless given, or --use-rollout-logprobs). Returns the global metrics
        (loss parts, grad_norm, lr, ...) averaged over the steps, plus num_optimizer_steps."""
        return self.defer(self._train_step(batch, loss_spec, max_response_len))

    async def _train_step(self, batch: Batch, loss_spec: AlgorithmConfig, max_response_len: int | None) -> dict[str, float]:
        steps = split_into_global_batches(len(batch), self.config.global_batch_size)
        if len(steps) > 1 and needs_old_logprobs(loss_spec) and batch.old_logprobs is None:
            # The steps after the first move π_θ away from the policy that π_old must stay:
            # one no-grad forward of the current weights over the whole rollout, as slime does.
            rows = await self._compute_logprobs(batch, "actor")
            batch = dataclasses.replace(batch, old_logprobs=[list(row.logprobs) for row in rows])
        per_step = []
        for indices in steps:
            per_step.append(await self._optimizer_step(batch.select(indices), loss_spec, max_response_len))
        if self.config.train_step_delay:
            # Outside the lock and without a CPU: the step only takes longer, as a slower trainer's would.
            await asyncio.sleep(self.config.train_step_delay)
        return mean_step_metrics(per_step)

    async def _optimizer_step(self, batch: Batch, loss_spec: AlgorithmConfig, max_response_len: int | None) -> dict[str, float]:
        normalizer = batch.normalizer(loss_spec.loss_agg, max_response_len)
        _, shards = self._shard(batch)
        per_rank = [(shard, loss_spec, normalizer) for (shard,) in shards]
        results = await self._all("train_step", per_rank=per_rank)
        return next(r for r in results if r is not None)

    def compute_logprobs(self, batch: Batch, model: str = "actor") -> Deferred:
        """Per-sample `SampleLogprobs` in batch order (``model="ref"``: the frozen reference)."""
        return self.defer(self._compute_logprobs(batch, model))

    async def _compute_logprobs(self, batch: Batch, model: str) -> list[SampleLogprobs]:
        bins, shards = self._shard(batch)
        results = await self._all("compute_logprobs", per_rank=shards, model=model)
        merged: list[SampleLogprobs | None] = [None] * len(batch)
        for info, rows in zip(self.ranks, results):
            if rows is None:
                continue
            for index, row in zip(bins[info.dp_rank], rows):
                merged[index] = row
        return merged  # type: ignore[return-value]

    def save(self, path: str) -> Deferred:
        """Megatron distributed checkpoint (model, optimizer, LR schedule, step, RNG) at ``path``."""
        return self.defer(self._all("save", str(path)))

    def load(self, path: str) -> Deferred:
        """Restore a checkpoint written by `save`; answers its step."""
        return self.defer(self._first_of(self._all("load", str(path))))

    def export_hf(self, path: str) -> Deferred:
        """HF safetensors + config + tokenizer at ``path`` (loadable by transformers / engines)."""
        return self.defer(self._all("export_hf", str(path)))

    def set_reference_model(self, hf_dir: str | None = None) -> Deferred:
        """Freeze the current weights (or an HF directory's) as the KL reference."""
        return self.defer(self._all("set_reference_model", hf_dir))

    def weight_metadata(self) -> Deferred:
        """Buckets of `TensorMeta` that `broadcast_weights` will send, in order."""
        return self.defer(self._first_of(self._all("weight_metadata")))

    def init_weight_group(self, spec: WeightGroupSpec) -> Deferred:
        """Trainer rank 0 joins the broadcast group (engines must join concurrently)."""
        return self.defer(self._all("init_weight_group", spec))

    def broadcast_weights(self, group_name: str = "weight_update_group", flattened: bool = True) -> Deferred:
        """Rank 0 broadcasts every bucket (engines must receive each bucket concurrently):
        one flat buffer per bucket, or (``flattened=False``) one broadcast per tensor."""
        return self.defer(self._first_of(self._all("broadcast_weights", group_name, flattened=flattened)))

    def destroy_weight_group(self, group_name: str = "weight_update_group") -> Deferred:
        return self.defer(self._all("destroy_weight_group", group_name))

    # ----- colocated training (--colocate: actors/trainer/residency.py) ----------------------------
    def offload(self, parts: Sequence[str]) -> Deferred:
        """Move ``parts`` (optimizer, grads, params) of every rank to host memory; the slowest rank's seconds."""
        return self.defer(self._max(self._all("offload", list(parts))))

    def onload(self) -> Deferred:
        """Bring every rank's offloaded state back to its device; the slowest rank's seconds."""
        return self.defer(self._max(self._all("onload")))

    def next_tensor_bucket(self, serving: Sequence[int]) -> Deferred:
        """The next bucket of the weight export: per rank its IPC payload ("" on ranks not in
        ``serving``); None when the export is done."""
        per_rank = [(rank in serving,) for rank in range(self.num_ranks)]
        return self.defer(self._bucket(self._all("next_tensor_bucket", per_rank=per_rank)))

    def end_tensor_export(self) -> Deferred:
        return self.defer(self._all("end_tensor_export"))

    def memory_peak(self) -> Deferred:
        """The largest rank's peak device bytes since the last call (CUDA allocated; CPU resident)."""
        return self.defer(self._max(self._all("memory_peak")))

    def device_pids(self) -> Deferred:
        """Every process on the ranks' GPUs (None where that cannot be told: CPU, or NVML blind
        to this pid namespace): whether an engine shares the trainer's devices."""
        return self.defer(self._device_pids(self._all("device_pids")))

    @staticmethod
    async def _device_pids(results: Awaitable[list[list[int] | None]]) -> list[int] | None:
        per_rank = await results
        return None if any(pids is None for pids in per_rank) else sorted({p for pids in per_rank for p in pids})

    @staticmethod
    async def _max(results: Awaitable[list[float]]) -> float:
        """The largest of every rank's answer (the slowest rank's seconds, the largest peak)."""
        return max(await results)

    @staticmethod
    async def _bucket(results: Awaitable[list[str | None]]) -> list[str | None] | None:
        payloads = await results
        return None if all(p is None for p in payloads) else list(payloads)

    def rank_info(self) -> list[RankInfo]:
        return list(self.ranks)

    def weight_master(self) -> Deferred:
        """(address, port) of the store trainer rank 0 hosts for every weight-update group: the
        rank binds the port itself before it is reported, so nothing can take it in between (on
        every interface: the address is rank 0's node IP, slime_async.weights.process_group.listening_store)."""
        return self.defer(self._weight_master())

    async def _weight_master(self) -> tuple[str, int]:
        address = next((info.node_ip for info in self.ranks if info.rank == 0 and info.node_ip), self.nodes[0].address)
        return address, await self._first_of(self._all("weight_store_port"))

    # ----- the critic (PPO's value model, its own torchrun group) -----------------------------------
    def critic_rank_info(self) -> list[RankInfo]:
        return list(self.critic.ranks) if self.critic else []

    def compute_values(self, batch: Batch) -> Deferred:
        """The critic's value of every response token, per sample in batch order."""
        return self.defer(self._compute_values(batch))

    async def _compute_values(self, batch: Batch) -> list[list[float]]:
        assert self.critic is not None, "compute_values needs a critic (--advantage-estimator ppo)"
        bins, shards = self._shard(batch, self.critic.ranks)
        results = await self._all("compute_values", per_rank=shards, role="critic")
        merged: list[list[float] | None] = [None] * len(batch)
        for info, rows in zip(self.critic.ranks, results):
            for index, row in zip(bins[info.dp_rank], rows or []):
                merged[index] = row
        return merged  # type: ignore[return-value]

    def train_critic(self, batch: Batch, value_clip: float, loss_agg: str, *,
                     max_response_len: int | None = None) -> Deferred:
        """Train the critic on ``batch.returns`` (clipped around ``batch.values``): as many optimizer
        steps as the policy takes on a rollout (--global-batch-size); their mean metrics."""
        return self.defer(self._train_critic(batch, value_clip, loss_agg, max_response_len))

    async def _train_critic(self, batch: Batch, value_clip: float, loss_agg: str,
                            max_response_len: int | None) -> dict[str, float]:
        assert self.critic is not None, "train_critic needs a critic (--advantage-estimator ppo)"
        per_step = []
        for indices in split_into_global_batches(len(batch), self.critic.config.global_batch_size):
            part = batch.select(indices)
            normalizer = part.normalizer(loss_agg, max_response_len)
            _, shards = self._shard(part, self.critic.ranks)
            per_rank = [(shard, value_clip, loss_agg, normalizer) for (shard,) in shards]
            results = await self._all("train_step", per_rank=per_rank, role="critic")
            per_step.append(next(r for r in results if r is not None))
        return mean_step_metrics(per_step)

    def save_critic(self, path: str) -> Deferred:
        """The critic's Megatron distributed checkpoint (model, value head, optimizer, schedule)."""
        return self.defer(self._all("save", str(path), role="critic"))

    def load_critic(self, path: str) -> Deferred:
        """Restore a checkpoint written by `save_critic` (a resume); answers its step."""
        return self.defer(self._first_of(self._all("load", str(path), role="critic")))

    def load_critic_weights(self, path: str) -> Deferred:
        """Only the value model's weights from a critic checkpoint (--critic-load)."""
        return self.defer(self._all("load_weights", str(path), role="critic"))

    @staticmethod
    async def _first_of(results) -> Any:
        values = await results
        return next((v for v in values if v is not None), None)

