"""``slime-async train``: build the supervision tree for a run, then run the RL loop in it.

    slime-async (root, one_for_one, no restarts: a failure ends this attempt with its reason; a run
                 that has trained then restarts whole from its latest checkpoint, --max-run-restarts)
    ├── engines (supervisor, one_for_one, --supervisor-max-restarts): engine-0 … engine-N
    ├── router (also the HTTP front: SGLang /generate + OpenAI API at --router-port) ── monitor ── buffer
    ├── trainer (torchrun group of Megatron ranks, driven over torch.distributed.rpc)
    └── rollout (producer of scored groups)
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from actors.buffer import BufferActor
from actors.critic.config import critic_checkpoint, critic_trainer_config
from actors.engine.fleet import build_fleet, build_teacher
from actors.loop.opd_config import served_model_dir
from actors.loop.placement import export_dir_check, in_cluster
from actors.loop.run_checkpoint import RunCheckpointer, checkpoint_directory, latest_checkpoint, read_run_state
from actors.loop.critic import uses_critic
from actors.loop.train_loop import Handles, RunProgress, train_loop
from actors.loop.replay import replay_loop
from actors.loop.sft import sft_loop
from actors.weight_sync.actor import WeightSyncActor
from actors.monitor import MonitorActor
from actors.rollout.actor import RolloutActor
from actors.rollout.data import PromptDataset, eval_datasets, prompt_dataset
from actors.rollout.teacher import TeacherScorer
from actors.router.actor import RouterActor
from actors.router.text_model import TextModel
from actors.trainer.actor import TrainerActor
from slime_async.actor import ActorRef, spawn
from slime_async.compat.slime.args import flatten_config
from slime_async.config.loader import dump_config, print_config
from actors.loop.run_config import RunConfig
from slime_async.runtime import EXIT_FAILURE, run, run_supervised
from slime_async.routed_experts import model_routed_layout
from slime_async.cluster.nodes import Cluster
from slime_async.supervisor import ChildSpec, Supervisor
from slime_async.trace import TraceRecorder
from policies.requirements import needs_engine_teacher

log = logging.getLogger("slime_async")


def _close_trace(trace: TraceRecorder) -> None:
    """The final trace file; one that cannot be written is reported, the run's exit code stands."""
    try:
        trace.close()
    except OSError as error:
        log.error("trace: the final %s could not be written (%s); the run itself is not affected", trace.path, error)


def run_train(config: RunConfig) -> int:
    """Run ``config`` (resolved: ``parse_run_config``) to the end; the exit code."""
    # Absolute: the trainer's torchrun and the engines run in other directories than the user's.
    run_dir = Path(config.cluster.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=config.cluster.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print_config(config)
    dump_config(config, run_dir / "config.yaml")
    use_uvloop = None if config.cluster.event_loop == "auto" else config.cluster.event_loop == "uvloop"
    restarts = 0
    while True:
        progress = RunProgress()
        trace = trace_recorder(config, restarts)
        try:
            code = run(lambda: in_cluster(config, lambda cluster: _main(config, run_dir, restarts, progress, cluster,
                                                                        trace)), use_uvloop=use_uvloop)
        finally:
            _close_trace(trace)
        if not should_restart(config, code, progress, restarts):
            return code
        # Each attempt is a fresh event loop and process tree; everything else comes from the
        # checkpoint, exactly as for `--load` by hand.
        restarts += 1
        latest = latest_checkpoint(config.checkpoint.save)
        if latest is not None:
            config = replace(config, checkpoint=replace(config.checkpoint, load=str(latest)))
        log.warning("the run failed after %d trained step(s); restart %d of %d from %s", progress.steps_trained,
                    restarts, config.checkpoint.max_run_restarts, config.checkpoint.load or "the start")


def trace_recorder(config: RunConfig, restarts: int) -> TraceRecorder:
    """--trace-dir's recorder for one attempt of the run (each restart writes a file of its own)."""
    if not config.monitor.trace_dir:
        return TraceRecorder.off()
    name = "trace.json" if not restarts else f"trace.restart{restarts}.json"
    train = config.train
    return TraceRecorder(Path(config.monitor.trace_dir) / name, max_events=config.monitor.trace_max_events,
                         metadata={"train_mode": train.train_mode, "max_staleness": config.buffer.max_staleness,
                                   "update_weight_transport": train.update_weight_transport,
                                   "weight_update_mode": train.weight_update_mode})


def should_restart(config: RunConfig, code: int, progress: RunProgress, restarts: int) -> bool:
    """A run restarts after a failure (not a signal) once it has trained: a failure before the
    first step (a bad reward module, an engine that cannot start) would only repeat."""
    return (code == EXIT_FAILURE and progress.steps_trained > 0 and bool(config.checkpoint.save)
            and restarts < config.checkpoint.max_run_restarts)


def _load_tokenizer(config: RunConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.trainer.hf_checkpoint)


def _vocab_size(model_dir: str | Path) -> int | None:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(str(model_dir)), "vocab_size", None)


async def _teacher_vocab_size(config: RunConfig, teacher_url: str, student_vocab: int | None) -> int | None:
    """The engine teacher's vocabulary: from its model directory (owned, or the one an external
    teacher's /model_info names when readable here), else the student's (it shares the tokenizer)."""
    teacher_dir = config.engine.opd_teacher_hf_checkpoint or await asyncio.to_thread(
        served_model_dir, teacher_url, config.engine.engine_api_key)
    if teacher_dir is None:
        log.warning("opd teacher %s: the model it serves is not readable here; sample tokens are checked against "
                    "the student's vocabulary [0, %s)", teacher_url, student_vocab)
        return student_vocab
    return _vocab_size(teacher_dir)


@dataclass(frozen=True)
class RunData:
    """The tokenizer and the prompts of a run, and the steps they make."""

    tokenizer: Any
    dataset: PromptDataset
    eval_dataset: dict[str, PromptDataset] | None  # {name: dataset} of --eval-prompt-data
    total_steps: int


def load_run_data(config: RunConfig) -> RunData:
    """Read --prompt-data (and --eval-prompt-data) with the model's tokenizer; a file none of whose
    rows is usable raises ValueError naming it."""
    r = config.rollout
    tokenizer = _load_tokenizer(config)
    dataset = prompt_dataset(r, r.prompt_data, tokenizer, shuffle=r.rollout_shuffle, num_epoch=r.num_epoch)
    total_steps = r.num_rollout or max(1, (len(dataset) * r.num_epoch) // r.rollout_batch_size)
    return RunData(tokenizer, dataset, eval_datasets(r, tokenizer), total_steps)


async def _main(config: RunConfig, run_dir: Path, restarts: int, progress: RunProgress, cluster: Cluster,
                trace: TraceRecorder) -> int:
    if config.train.debug_train_only:
        return await _trainer_only(config, run_dir, 0, lambda root: replay_loop(
            config, trainer=root.child("trainer"), monitor=root.child("monitor")), cluster=cluster, trace=trace)
    if config.algorithm.loss_type == "sft":
        return await _sft_main(config, run_dir, load_run_data(config), cluster, trace)
    # The tokenizer and the prompts load while the engines and the trainer's ranks start: seconds of
    # imports (transformers) that no child waits for. In a thread, so the event loop spawns the
    # children meanwhile (it imports little then, and nothing of transformers'). Prompt files were
    # found readable before (preflight); one with no usable row ends the start with its name, and
    # the children already started are stopped.
    data_load = asyncio.ensure_future(asyncio.to_thread(load_run_data, config))
    try:
        return await _rl_main(config, run_dir, restarts, progress, cluster, trace, data_load)
    finally:
        if not data_load.done():
            data_load.cancel()
        elif not data_load.cancelled():
            data_load.exception()  # retrieved: a failure was reported where the start awaited it


async def _rl_main(config: RunConfig, run_dir: Path, restarts: int, progress: RunProgress, cluster: Cluster,
                   trace: TraceRecorder, data_load: asyncio.Future[RunData]) -> int:
    import torch

    r = config.rollout
    logs = run_dir / "logs"
    gpu_available = torch.cuda.is_available()
    trainer_gpus = 0 if config.train.debug_rollout_only or not gpu_available else config.trainer.actor_num_gpus_per_node
    critic_first_gpu = critic_gpu_offset(config, trainer_gpus, torch.cuda.device_count() if gpu_available else 0)
    trainer_gpus += critic_first_gpu  # 0 when the critic shares the policy's GPUs
    trainer_gpus = engines_first_gpu(config, trainer_gpus)
    fleet = await build_fleet(config.engine, config.trainer.hf_checkpoint, logs, gpu_available=gpu_available,
                              first_gpu=trainer_gpus, gpu_count=torch.cuda.device_count() if gpu_available else 0,
                              nodes=cluster.nodes, trainer_nodes=config.trainer.actor_num_nodes,
                              delta_receivers=config.train.update_weight_transport == "delta")
    log.info("engines (%s): %s", fleet.kind, ", ".join(fleet.urls))
    teacher_url, teacher_children = await opd_teacher(config, fleet.kind, logs, first_gpu=trainer_gpus,
                                                      gpu_available=gpu_available)

    def child(name: str):
        return root.child(name)

    async def start_router():
        data = await data_load
        return await spawn(RouterActor(config.router, fleet.urls, api_key=config.engine.engine_api_key,
                                       model=_text_model(config, data.tokenizer), trace=trace))

    async def start_monitor():
        data = await data_load
        return await spawn(MonitorActor(config.monitor, run_dir, total_steps=data.total_steps,
                                        resume_step=_resume_step(config, restarts)))

    specs = [
        # The first child: a prompt file that fails to load ends the start at once, not once the
        # engines are up (minutes, for SGLang).
        ChildSpec("engines", lambda: start_unless_failed(data_load, spawn(Supervisor(
            "engines", fleet.children + teacher_children, max_restarts=config.cluster.supervisor_max_restarts,
            max_seconds=config.cluster.supervisor_max_seconds)))),
        ChildSpec("router", start_router),
        ChildSpec("monitor", start_monitor),
        ChildSpec("buffer", lambda: spawn(BufferActor(config.buffer, groups_per_step=config.groups_per_version))),
    ]
    early_rollout = not config.train.debug_rollout_only and rollout_starts_with_trainer(config, gpu_available, restarts)
    rollout_spec = ChildSpec("rollout", lambda: start_rollout(generate=early_rollout))
    if not config.train.debug_rollout_only:
        # PPO's critic is a second torchrun group of the same actor (one RPC agent per process).
        critic = critic_trainer_config(config.trainer, config.critic) if uses_critic(config.algorithm) else None
        if early_rollout:  # before the trainer in the start order
            specs.append(rollout_spec)
        specs.append(ChildSpec("trainer", lambda: spawn(TrainerActor(config.trainer, logs, critic=critic,
                                                                     critic_first_gpu=critic_first_gpu,
                                                                     nodes=cluster.nodes, trace=trace)),
                               start_early=trainer_starts_with_engines(config, gpu_available)))

        specs.append(ChildSpec("weight_sync", lambda: spawn(WeightSyncActor(
            child("trainer"), child("router"), config.train.update_weight_transport, config.train.weight_update_mode,
            run_dir / "weights", api_key=config.engine.engine_api_key, timeout=config.train.weight_update_timeout,
            delta_receivers=fleet.delta_receivers | config.train.delta_receivers(),
            export_dir_check=export_dir_check(cluster, fleet, child("trainer"), run_dir / "weights"),
            colocate=config.train.colocate, trace=trace,
            hold_dir=Path(config.train.debug_hold_weight_sync) if config.train.debug_hold_weight_sync else None))))

    async def start_rollout(*, generate: bool):
        data = await data_load
        vocab_size = _vocab_size(config.trainer.hf_checkpoint)
        teacher = None if teacher_url is None else TeacherScorer(
            teacher_url, vocab_size=await _teacher_vocab_size(config, teacher_url, vocab_size),
            api_key=config.engine.engine_api_key, timeout=config.engine.engine_request_timeout)
        rollout = RolloutActor(r, router=child("router"), buffer=child("buffer"), dataset=data.dataset,
                               tokenizer=data.tokenizer, vocab_size=vocab_size,
                               plugin_settings=flatten_config(config), trace=trace, teacher=teacher)
        # Hooks reach the router's HTTP front here (OpenAI-client agents, slime-style plug-ins).
        rollout.ctx.router_url = await child("router").ask("front_url")
        rollout.ctx.router_api_key = config.router.router_api_key
        if r.use_rollout_routing_replay:  # the MoE layers the samples' routed experts keep
            rollout.ctx.routed_layout = model_routed_layout(config.trainer.hf_checkpoint)
        ref = await spawn(rollout)
        if generate:
            log.info("rollout: generating beside the trainer's start (the engines serve the weights it starts from)")
            ref.tell("start")
        return ref

    if not early_rollout:
        specs.append(rollout_spec)
    root = Supervisor("slime-async", specs, max_restarts=0, max_seconds=1)

    async def main(_root: Supervisor) -> int:
        data = await data_load
        trainer = None if config.train.debug_rollout_only else child("trainer")
        checkpointer = RunCheckpointer(config.checkpoint, trainer=trainer, rollout=child("rollout"),
                                       buffer=child("buffer"), critic=uses_critic(config.algorithm))
        sync = None if trainer is None else child("weight_sync")
        if sync is not None:
            await sync.ask("check_engines", timeout=None)
        start_step = start_version = 0
        if trainer is not None and config.critic.critic_load:
            await trainer.ask("load_critic_weights", str(critic_checkpoint(config.critic.critic_load).resolve()),
                              timeout=None)
        if config.checkpoint.load:
            start_step, start_version = await checkpointer.load(config.checkpoint.load)
        if sync is not None and (start_version > 0 or restarts or config.engine.engine_type == "external"):
            # Owned engines start from the HF checkpoint; external ones serve whatever they were
            # given last (an earlier run, a failed attempt): give them the weights this run starts from.
            await sync.ask("sync", start_version, timeout=None)
        if config.checkpoint.load:
            await child("buffer").ask("set_version", start_version)
        handles = Handles(rollout=child("rollout"), buffer=child("buffer"), trainer=trainer, router=child("router"),
                          monitor=child("monitor"), weight_sync=sync, checkpointer=checkpointer,
                          eval_dataset=data.eval_dataset, total_steps=data.total_steps, start_step=start_step,
                          start_version=start_version, restarts=restarts, progress=progress,
                          colocate=config.train.colocate, trace=trace)
        if sync is not None:
            await sync.ask("hand_devices_to_engines", timeout=None)  # colocated: the first rollout has the devices
        code = await with_outcome(child("monitor"), train_loop(config, handles))
        print(f"run finished: {run_dir}", file=sys.stderr)
        return code

    return await run_supervised(root, main)



async def opd_teacher(config: RunConfig, kind: str, logs: Path, *, first_gpu: int,
                      gpu_available: bool) -> tuple[str | None, list[ChildSpec]]:
    """--opd-type sglang: the teacher engine's URL and the child that runs it (owned); else nothing."""
    if not needs_engine_teacher(config.algorithm):
        return None, []
    import importlib.util

    import torch

    if kind == "external":  # the policy's engines are not ours: the teacher takes what this host runs
        kind = "sglang" if gpu_available and importlib.util.find_spec("sglang") is not None else "cpu"
    engine_gpus = config.engine.rollout_num_gpus if kind == "sglang" else 0
    url, children = await build_teacher(config.engine, kind, logs, first_gpu=first_gpu + engine_gpus,
                                        gpu_count=torch.cuda.device_count() if gpu_available else 0)
    log.info("on-policy distillation teacher: %s", url)
    return url, children


def engines_share_trainer_gpus(config: RunConfig) -> bool:
    """Whether the run's SGLang engines sit on the trainer's GPUs: colocated (time-shared), moved by
    IPC handles (``tensor``: a handle is only valid on its own device) or --rollout-share-trainer-gpus."""
    return (config.train.colocate or config.train.update_weight_transport == "tensor"
            or config.engine.rollout_share_trainer_gpus)


def engines_first_gpu(config: RunConfig, trainer_gpus: int) -> int:
    """The first GPU of the run's SGLang engines: after the trainer's ``trainer_gpus`` (its ranks and a
    critic of its own), or GPU 0 where they share the trainer's GPUs."""
    return 0 if engines_share_trainer_gpus(config) else trainer_gpus


def trainer_starts_with_engines(config: RunConfig, gpu_available: bool) -> bool:
    """Whether the trainer's ranks start beside the engines rather than after them (seconds saved:
    nothing in either start waits for the other; the weight-update group forms after both are up).
    Not where they share GPUs: SGLang sizes its memory pool from what is free on the device when it
    starts, and the colocation phases begin with the engines holding the devices."""
    return not gpu_available or not engines_share_trainer_gpus(config)


def rollout_starts_with_trainer(config: RunConfig, gpu_available: bool, restarts: int) -> bool:
    """Whether the rollout generates while the trainer's ranks are still starting, its child placed
    before the trainer's (the first step's groups are ready sooner, or done, when the trainer is).
    Only where the engines already serve the weights the trainer starts from, the HF checkpoint, and
    keep their devices: no --load or restart (a checkpoint's weights reach the engines by a sync first),
    owned engines (an external one serves whatever it was given last), no colocation (the engines get
    the devices only once the trainer is up), and the trainer starting beside the engines."""
    return (trainer_starts_with_engines(config, gpu_available) and not config.train.colocate
            and not config.checkpoint.load and not restarts and config.engine.engine_type != "external")


def critic_gpu_offset(config: RunConfig, policy_gpus: int, gpu_count: int) -> int:
    """The first GPU of PPO's critic group: right after the policy's when the host has GPUs for
    both and for the SGLang engines, else 0 (it shares the policy's GPUs, as on a one-GPU host)."""
    if not policy_gpus or not uses_critic(config.algorithm):
        return 0
    engine_gpus = config.engine.rollout_num_gpus if config.engine.engine_type in ("auto", "sglang") else 0
    if engines_first_gpu(config, policy_gpus) == 0:
        engine_gpus = 0  # the engines are on the policy's GPUs
    return policy_gpus if 2 * policy_gpus + engine_gpus <= gpu_count else 0


async def start_unless_failed(other: asyncio.Future, start: Awaitable[ActorRef]) -> ActorRef:
    """``start``'s actor, unless ``other`` fails first: then the start is cancelled (what it started
    stops) and ``other``'s error raised."""
    starting = asyncio.ensure_future(start)
    await asyncio.wait([starting, other], return_when=asyncio.FIRST_COMPLETED)
    if not starting.done() and not other.cancelled() and other.exception() is not None:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        raise other.exception()
    return await starting


def _text_model(config: RunConfig, tokenizer) -> TextModel:
    """What the router's HTTP front needs of the model: tokenizer, chat template, context."""
    model = TextModel.load(config.trainer.hf_checkpoint, tokenizer=tokenizer,
                           served_name=config.router.router_served_model_name,
                           tool_parser=config.router.router_tool_parser)
    if config.rollout.use_rollout_routing_replay:  # trajectories the front records carry the experts
        model.routed_layout = model_routed_layout(config.trainer.hf_checkpoint)
    return model


def _resume_step(config: RunConfig, restarts: int) -> int | None:
    """The first step this attempt logs when it repeats steps already logged in the run dir:
    TensorBoard hides the earlier attempt's points from there on."""
    if config.checkpoint.load:
        return int(read_run_state(checkpoint_directory(config.checkpoint.load))["step"]) + 1
    return 1 if restarts else None


async def _sft_main(config: RunConfig, run_dir: Path, data: RunData, cluster: Cluster, trace: TraceRecorder) -> int:
    """The warm start: trainer and monitor only, no engines."""
    return await _trainer_only(config, run_dir, data.total_steps, lambda root: sft_loop(
        trainer=root.child("trainer"), monitor=root.child("monitor"), dataset=data.dataset, tokenizer=data.tokenizer,
        spec=config.algorithm, batch_size=config.rollout.rollout_batch_size, total_steps=data.total_steps,
        save_hf=config.checkpoint.save_hf), cluster=cluster, trace=trace)


async def _trainer_only(config: RunConfig, run_dir: Path, total_steps: int, main, cluster: Cluster,
                        trace: TraceRecorder) -> int:
    """A tree of just the monitor and the trainer, running ``main(root)``."""
    root = Supervisor("slime-async-trainer", [
        ChildSpec("monitor", lambda: spawn(MonitorActor(config.monitor, run_dir, total_steps=total_steps or None))),
        ChildSpec("trainer", lambda: spawn(TrainerActor(config.trainer, run_dir / "logs", nodes=cluster.nodes,
                                                        trace=trace))),
    ], max_restarts=0, max_seconds=1)
    return await run_supervised(root, lambda root: with_outcome(root.child("monitor"), main(root)))


async def with_outcome(monitor: ActorRef, work: Awaitable[int]) -> int:
    """Run ``work`` and tell the monitor how the run ended (its exit code; 1 when it raised or was
    cancelled), before the tree stops: wandb marks the run failed unless it ended with 0."""
    code = 1
    try:
        code = await work
        return code
    finally:
        try:
            await monitor.ask("set_outcome", code, timeout=5.0)
        except Exception as error:  # noqa: BLE001 - a monitor that is gone has nothing to mark
            log.debug("monitor: run outcome not recorded: %s", error)
