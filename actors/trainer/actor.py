"""`TrainerActor`: the supervisor's handle on the torchrun group of Megatron ranks.

It owns the torchrun process (a `ProcessChild`) and the RPC bridge. Every operation is sent
to all ranks (SPMD), each with its DP shard, and awaited without blocking the event loop.
Operations are serialised by a lock: collectives must be issued in the same order on every
rank, and two concurrent ops could reach two ranks in different orders.

Failure: a watcher polls the ranks' pids and the torchrun process. When a rank dies, every
pending call fails at once with `TrainerRankDied` (rank, pid, log tail) and the actor fails
with it, which is how its supervisor learns of it.

Call the handlers through ``ask`` with a timeout fit for the work (``timeout=None`` for
training); they answer through ``defer``, so the mailbox stays free meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

import psutil
import torch

from actors.megatron.config import TrainerConfig
from actors.megatron.dp_split import split_across_dp, split_into_global_batches
from actors.megatron.protocol import RankInfo
from actors.trainer import worker
from actors.trainer.protocol import SampleLogprobs
from slime_async.weights.protocol import WeightGroupSpec
from policies.loss_spec import LossSpec
from policies.requirements import needs_old_logprobs
from slime_async.actor import Actor, ActorFailed, ActorRef, Deferred, spawn
from slime_async.child_env import PACKAGES_ROOT, child_pythonpath
from slime_async.batch import Batch
from slime_async.cluster.nodes import LocalNode, Node
from slime_async.process import ProcessChild, ProcessExited, ProcessSpec, log_tail
from slime_async.rpc import RpcBridge, RpcError
from slime_async.trace import TraceRecorder
from slime_async.net import free_port
from slime_async.weights.process_group import nccl_env_defaults

log = logging.getLogger(__name__)


# How long to let torchrun write its failure summary after a rank died, before reporting.
_DEATH_REPORT_GRACE = 5.0
_WATCH_INTERVAL = 0.1


class TrainerRankDied(RuntimeError):
    def __init__(self, rank: int | None, pid: int | None, log_path: Path, tail: str, detail: str = "",
                 group: str = "trainer"):
        who = f"{group} rank {rank} (pid {pid})" if rank is not None else f"the {group} (torchrun)"
        super().__init__(f"{who} died{': ' + detail if detail else ''}; last lines of {log_path}:\n{tail}")
        self.rank = rank
        self.pid = pid
        self.log_path = log_path
        self.group = group  # "trainer" (the policy) or "critic"




def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?\brank\s*:\s*(\d+)", re.DOTALL)


def _root_cause_rank(torchrun_log_tail: str) -> int | None:
    """The global rank torchrun's failure summary names as the first observed failure."""
    # The log is appended across restarts: only read what follows the latest start marker.
    current = torchrun_log_tail.rsplit("=== ", 1)[-1] if "start: " in torchrun_log_tail else torchrun_log_tail
    match = _ROOT_CAUSE.search(current)
    return int(match.group(1)) if match else None


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
_LAST_STEP_METRICS = ("step", "skipped_steps")  # skipped_steps: a running count (ops.py)


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
class _CriticGroup:
    """PPO's value model: a second torchrun group of its own, in the policy's RPC group (torch's
    RPC agent is process-wide, so the supervisor has one bridge for both)."""

    config: TrainerConfig
    num_ranks: int
    child_ref: ActorRef | None = None
    ranks: list[RankInfo] = dataclasses.field(default_factory=list)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # the policy's ops may overlap

    @property
    def child(self) -> ProcessChild:
        assert self.child_ref is not None
        return self.child_ref.actor  # type: ignore[return-value]


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
        self.node_refs: list[ActorRef] = []  # the torchruns of nodes 1.. (node 0's is child_ref)
        self._rendezvous_id = ""
        self.log_dir = Path(log_dir)
        self.num_ranks = config.num_ranks(torch.cuda.is_available()) * config.actor_num_nodes
        self.ranks: list[RankInfo] = []
        self.child_ref: ActorRef | None = None
        self.critic = (_CriticGroup(critic.validate(), critic.num_ranks(torch.cuda.is_available()) * critic.actor_num_nodes)
                       if critic is not None else None)
        self.critic_first_gpu = critic_first_gpu  # on GPU: 0 shares the policy's GPUs
        self.bridge: RpcBridge | None = None
        self._op_lock = asyncio.Lock()
        self._trace = trace or TraceRecorder.off()  # --trace-dir: each op on the ranks is a span
        self._death: TrainerRankDied | None = None
        self._died = asyncio.Event()

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
        self.log_dir.mkdir(parents=True, exist_ok=True)
        head = self.nodes[0]
        rpc_port = free_port(head.address)
        self._rendezvous_id = f"{self.name}-{os.getpid()}-{rpc_port}"
        rendezvous_port = self.config.master_port or free_port(head.address)
        # Both specs first: a critic that cannot be placed fails before anything is started.
        spec = self._spec(rpc_port, rendezvous_port=rendezvous_port)
        critic_spec = self._spec(rpc_port, "critic") if self.critic is not None else None
        self.child_ref = await spawn(head.process(spec, self.log_dir))
        try:
            for node in self.nodes[1:]:
                # The rank config travels to the node: its filesystem need not be the head's.
                node_spec = self._spec(rpc_port, node_rank=node.rank, rendezvous_port=rendezvous_port)
                await node.write_text(node_spec.argv[node_spec.argv.index("--config-json") + 1],
                                      Path(node_spec.argv[node_spec.argv.index("--config-json") + 1]).read_text())
                self.node_refs.append(await spawn(node.process(node_spec, self.log_dir)))
        except BaseException:
            await self._teardown()
            raise
        if critic_spec is not None:
            try:
                self.critic.child_ref = await spawn(ProcessChild(critic_spec, self.log_dir))
            except BaseException:
                await self._teardown()
                raise
        self.bridge = RpcBridge(
            f"tcp://{head.address}:{rpc_port}", self._rpc_world_size, start_timeout=self.config.trainer_start_timeout
        )
        refs = [self.child_ref, *self.node_refs] + ([self.critic.child_ref] if self.critic else [])
        children = [ref.actor for ref in refs]
        try:
            joined = asyncio.ensure_future(self.bridge.start())
            exits = [asyncio.ensure_future(ref.wait()) for ref in refs]
            async with asyncio.timeout(self.config.trainer_start_timeout):
                await asyncio.wait([joined, *exits], return_when=asyncio.FIRST_COMPLETED)
            if not joined.done():
                for exited, child in zip(exits, children):
                    if exited.done():
                        exited.result()  # raises the torchrun failure (with its log tail)
                        raise RuntimeError(f"torchrun exited before the trainer ranks joined; see {child.log_path}")
            for exited in exits:
                exited.cancel()
            joined.result()
            infos = await asyncio.gather(*(self._call(r, "info") for r in range(self.num_ranks)))
            if self.critic is not None:
                critic_infos = await asyncio.gather(*(self._call(r, "info", role="critic")
                                                      for r in range(self.critic.num_ranks)))
                self.critic.ranks = sorted(critic_infos, key=lambda info: info.rank)
        except BaseException as error:
            await self._teardown()
            if isinstance(error, TimeoutError):
                tails = "\n".join(f"last lines of {child.log_path}:\n{log_tail(child.log_path)}" for child in children)
                raise TimeoutError(
                    f"trainer ranks did not start within --trainer-start-timeout "
                    f"{self.config.trainer_start_timeout:g} s; {tails}"
                ) from None
            if isinstance(error, ActorFailed):
                raise error.error from None
            raise
        self.ranks = sorted(infos, key=lambda info: info.rank)
        log.info("trainer ready: %d ranks, dp=%d tp=%d pp=%d", self.num_ranks, self.dp_size, self.ranks[0].tp_size, self.ranks[0].pp_size)
        self.spawn(self._watch(), name=f"{self.name}:watch")

    @property
    def child(self) -> ProcessChild:
        assert self.child_ref is not None
        return self.child_ref.actor  # type: ignore[return-value]

    @property
    def dp_size(self) -> int:
        return self.ranks[0].dp_size

    async def _watch(self) -> None:
        """Fail the actor (and every pending call) as soon as a rank or torchrun is gone."""
        # (group name, torchrun child, its ranks): the policy's, then the critic's.
        # Ranks on other nodes are watched through their node's torchrun (their pids are not ours).
        local = [info for info in self.ranks if info.node_ip in ("", self.nodes[0].address)]
        groups = [("trainer", self.child_ref, local), *(("trainer", ref, []) for ref in self.node_refs)]
        if self.critic is not None:
            groups.append(("critic", self.critic.child_ref, self.critic.ranks))
        exits = [asyncio.ensure_future(ref.wait()) for _, ref, _ in groups]
        try:
            while True:
                failed = next((g for g, (_, _, ranks) in enumerate(groups)
                               if exits[g].done() or any(not _pid_alive(info.pid) for info in ranks)), None)
                if failed is not None:
                    break
                await asyncio.wait(exits, timeout=_WATCH_INTERVAL, return_when=asyncio.FIRST_COMPLETED)
            group, child_ref, ranks = groups[failed]
            child = child_ref.actor
            exited = exits[failed]
            dead = [info for info in ranks if not _pid_alive(info.pid)]
            if dead and not exited.done():
                # torchrun notices too and prints which rank failed and how; give it a moment.
                await asyncio.wait([exited], timeout=_DEATH_REPORT_GRACE)
        finally:
            for pending in exits:
                if not pending.done():
                    pending.cancel()
        detail = ""
        if exited.done() and not exited.cancelled() and exited.exception() is not None:
            error = exited.exception()
            cause = error.error if isinstance(error, ActorFailed) else error
            if isinstance(cause, ProcessExited):
                detail = f"torchrun exited with code {cause.returncode}"
            else:  # e.g. the agent of the node that ran it went away
                detail = str(cause).splitlines()[0]
        tail = log_tail(child.log_path, 40)
        # Ranks that torchrun stopped after the first failure are dead too by now: prefer
        # torchrun's own "first observed failure", then the first rank seen dead.
        root = _root_cause_rank(tail)
        first = next((i for i in ranks if i.rank == root), None) or (dead[0] if dead else None)
        death = TrainerRankDied(
            first.rank if first else None, first.pid if first else None,
            child.log_path, tail, detail, group=group,
        )
        self._death = death
        self._died.set()
        if self.bridge is not None:
            self.bridge.fail_pending(death)
        raise death

    async def on_stop(self) -> None:
        await self._teardown()

    async def _teardown(self) -> None:
        """Leave the RPC group, then stop torchrun (SIGTERM to its group, then SIGKILL).

        Ranks are not asked to exit over RPC: a graceful RPC shutdown is a barrier whose
        bookkeeping only matches on a process's first RPC group (a restarted trainer would
        hang in it), and ranks hold no state a checkpoint did not already write.
        """
        bridge, self.bridge = self.bridge, None
        if bridge is not None:
            bridge.fail_pending(RuntimeError(f"the trainer {self.name!r} is stopping"))
            await bridge.shutdown(graceful=False)
        if self.critic is not None and self.critic.child_ref is not None:
            await self.critic.child_ref.stop()
        for ref in reversed(self.node_refs):
            await ref.stop()
        self.node_refs = []
        if self.child_ref is not None:
            await self.child_ref.stop()

    # ----- RPC plumbing --------------------------------------------------------------------------
    def _call(self, rank: int, op: str, *args: Any, role: str = "actor", **kwargs: Any) -> asyncio.Future:
        if self._death is not None:
            raise self._death
        assert self.bridge is not None
        timeout = self.config.op_timeout
        return self.bridge.call(f"{worker.rpc_prefix(role)}{rank}", worker.call, op, *args, timeout=timeout, **kwargs)

    async def _all(self, op: str, *args: Any, per_rank: Sequence[tuple] | None = None, **kwargs: Any) -> list[Any]:
        """Run ``op`` on every rank (rank r gets ``per_rank[r]`` as args when given)."""
        return await self._all_of("actor", op, *args, per_rank=per_rank, **kwargs)

    async def _all_of(self, role: str, op: str, *args: Any, per_rank: Sequence[tuple] | None = None,
                      **kwargs: Any) -> list[Any]:
        """`_all` on the ranks of ``role``'s group: "actor" (the policy) or "critic"."""
        critic = role == "critic"
        if critic and self.critic is None:
            raise ValueError(f"critic op {op!r}, but this trainer has no critic (--advantage-estimator ppo)")
        lock = self.critic.lock if critic else self._op_lock
        num_ranks = self.critic.num_ranks if critic else self.num_ranks
        lane = self._trace.lane("critic" if critic else "trainer", "ranks")
        async with lock, self._trace.span(_op_name(op, kwargs), lane, cat="train", op=op, **_op_args(per_rank)):
            calls = [
                self._call(r, op, *(per_rank[r] if per_rank is not None else args), role=role, **kwargs)
                for r in range(num_ranks)
            ]
            try:
                return await asyncio.gather(*calls)
            except RpcError as error:
                for c in calls:
                    c.cancel()
                # The transport may notice a dead peer ("eof") before the watcher does; the
                # caller should get the report that names the rank, so wait for it briefly.
                try:
                    async with asyncio.timeout(_DEATH_REPORT_GRACE + 2 * _WATCH_INTERVAL + 1.0):
                        await self._died.wait()
                except TimeoutError:
                    raise error from None
                raise self._death from error
            except BaseException:
                for c in calls:
                    c.cancel()
                raise

    def _shard(self, batch: Batch, ranks: Sequence[RankInfo] | None = None) -> tuple[list[list[int]], list[tuple]]:
        """DP bins of sample indices and each rank's shard (TP/PP peers share their DP shard);
        ``ranks``: another group's (the critic's) instead of the policy's."""
        ranks = self.ranks if ranks is None else ranks
        bins = split_across_dp(batch.lengths, ranks[0].dp_size)
        shards = [batch.select(b) for b in bins]
        return bins, [(shards[info.dp_rank],) for info in ranks]

    # ----- operations (answered through defer) -----------------------------------------------------
    def train_step(self, batch: Batch, loss_spec: LossSpec, *, max_response_len: int | None = None) -> Deferred:
        """Train on one rollout's ``batch``: len(batch) / --global-batch-size optimizer steps (one when
        unset), on consecutive global batches. Before the first of several steps, π_old is recomputed
        for the whole batch (unless given, or --use-rollout-logprobs). Returns the global metrics
        (loss parts, grad_norm, lr, ...) averaged over the steps, plus num_optimizer_steps."""
        return self.defer(self._train_step(batch, loss_spec, max_response_len))

    async def _train_step(self, batch: Batch, loss_spec: LossSpec, max_response_len: int | None) -> dict[str, float]:
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

    async def _optimizer_step(self, batch: Batch, loss_spec: LossSpec, max_response_len: int | None) -> dict[str, float]:
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

    # ----- colocated training (--colocate: actors/trainer/colocate.py) ----------------------------
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
        results = await self._all_of("critic", "compute_values", per_rank=shards)
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
            results = await self._all_of("critic", "train_step", per_rank=per_rank)
            per_step.append(next(r for r in results if r is not None))
        return mean_step_metrics(per_step)

    def save_critic(self, path: str) -> Deferred:
        """The critic's Megatron distributed checkpoint (model, value head, optimizer, schedule)."""
        return self.defer(self._all_of("critic", "save", str(path)))

    def load_critic(self, path: str) -> Deferred:
        """Restore a checkpoint written by `save_critic` (a resume); answers its step."""
        return self.defer(self._first_of(self._all_of("critic", "load", str(path))))

    def load_critic_weights(self, path: str) -> Deferred:
        """Only the value model's weights from a critic checkpoint (--critic-load)."""
        return self.defer(self._all_of("critic", "load_weights", str(path)))

    @staticmethod
    async def _first_of(results) -> Any:
        values = await results
        return next((v for v in values if v is not None), None)

