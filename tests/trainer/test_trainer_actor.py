"""The trainer group driven over torch RPC: real torchrun ranks, real RPC, real CPU engine.

Three launches, each a scenario recorded once per session and asserted on by several tests:
- ``tp2``: 2 ranks, TP=2 (the qwen2 tiny model's vocab of 127 is padded to 128): logprobs,
  reference, 4 train steps with a ticker, HF export, weight broadcast into a CPU engine, three
  syncs over one kept weight-update group, kill -9 and restart of the engine (the group is
  rebuilt), and finally kill -9 of rank 1;
- ``dp2``: 2 ranks, DP=2, TP=1: the same 3 steps (TP=1 vs TP=2), save, a 4th step, then SFT;
- ``resumed``: a new dp2 group loads that checkpoint and takes the 4th step again.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
import torch
from safetensors.torch import load_file

from actors.weight_sync.distributed import EngineSetGroup, engine_identity, send_weights, update_engine_weights
from actors.megatron.protocol import TrainerOpError
from actors.trainer.actor import TrainerRankDied
from slime_async.weights.protocol import WeightGroupSpec
from slime_async.actor import ActorFailed
from slime_async.engine_client import EngineClient
from worker_fixtures import (
    PPO_KL,
    SFT,
    count_ticks_during,
    env_threads,
    fixed_batch,
    free_port,
    running_trainer,
    start_cpu_engine,
    trainer_config,
    transformers_greedy,
    transformers_logprobs,
)

pytestmark = pytest.mark.slow

GREEDY_PROMPT = [3, 17, 25, 9, 40]
SFT_STEPS = 20


@dataclass
class Run:
    logprobs0: list[list[float]] = field(default_factory=list)
    entropy0: list[list[float]] = field(default_factory=list)
    ref_logprobs: list[list[float]] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    ticks: int = 0
    ticker_finished_first: bool = False
    logprobs_after: list[list[float]] = field(default_factory=list)
    export_dir: Path | None = None
    engine_tokens: list[int] = field(default_factory=list)
    tensors_sent: int = 0
    death_seen_by_call: BaseException | None = None
    death_seen_by_supervisor: BaseException | None = None
    death_report_s: float = 0.0
    killed_rank: int = -1
    sft_losses: list[float] = field(default_factory=list)
    teacher_logprobs: list[list[float]] = field(default_factory=list)  # --opd-teacher-load of a checkpoint
    loaded_logprobs: list[list[float]] = field(default_factory=list)  # the policy right after loading it
    ckpt_dir: Path | None = None
    op_error: BaseException | None = None
    alive_after_op_error: bool = False
    # the kept weight-update group (EngineSetGroup) and the store port
    squatter_errno: int | None = None  # binding the reported store port right after weight_master
    group: dict = field(default_factory=dict)


async def _logprobs(trainer, batch, model="actor"):
    rows = await trainer.ask("compute_logprobs", batch, model=model, timeout=None)
    return [r.logprobs for r in rows], [r.entropy for r in rows]


async def _tp2_scenario(hf_dir: Path, work: Path) -> Run:
    run = Run()
    # Buckets of ~20 KB: the tiny model goes in many, so the flattened broadcast overlaps gathers.
    config = trainer_config(hf_dir, procs=2, tp=2, use_reference=True, weight_bucket_mb=0.02)
    t0 = time.monotonic()
    # The engine starts while the trainer does (each is seconds of imports and loading).
    engine_start = asyncio.ensure_future(start_cpu_engine(hf_dir, work / "logs"))
    engine_ref = None
    try:
        async with running_trainer(config, work / "logs") as trainer:
            engine_ref, url = await engine_start
            print(f"tp2: trainer and engine up after {time.monotonic() - t0:.1f} s")
            run.logprobs0, run.entropy0 = await _logprobs(trainer, fixed_batch())
            run.ref_logprobs, _ = await _logprobs(trainer, fixed_batch(), model="ref")
            batch = fixed_batch(old_logprobs=run.logprobs0, ref_logprobs=run.ref_logprobs)
            step, run.ticks, run.ticker_finished_first = await count_ticks_during(
                trainer.ask("train_step", batch, PPO_KL, timeout=None)
            )
            run.steps.append(step)
            for _ in range(3):
                run.steps.append(await trainer.ask("train_step", batch, PPO_KL, timeout=None))

            run.export_dir = work / "export"
            await trainer.ask("export_hf", str(run.export_dir), timeout=None)
            run.logprobs_after, _ = await _logprobs(trainer, fixed_batch())

            spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, group_name="sync-test")
            async with EngineClient(url) as engine:
                run.tensors_sent = await update_engine_weights(trainer, [engine], spec, weight_version="1", timeout=120)
                answer = await engine.generate(
                    GREEDY_PROMPT, {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
                )
                run.engine_tokens = list(answer["output_ids"])

            print(f"tp2: weights synced after {time.monotonic() - t0:.1f} s")
            engine_ref = await _kept_group_scenario(run, trainer, engine_ref, url, hf_dir, work)
            print(f"tp2: kept group and engine restart done after {time.monotonic() - t0:.1f} s")
            # kill -9 a rank while a step is in flight.
            info = (await trainer.ask("rank_info"))[1]
            run.killed_rank = info.rank
            pending = asyncio.ensure_future(trainer.ask("train_step", batch, PPO_KL, timeout=None))
            await asyncio.sleep(0)
            killed_at = time.monotonic()
            os.kill(info.pid, signal.SIGKILL)
            async with asyncio.timeout(60):  # a guard against a hang, not a measurement
                try:
                    await pending
                except Exception as error:  # noqa: BLE001 - recorded for the assertions
                    run.death_seen_by_call = error
                run.death_report_s = time.monotonic() - killed_at
                try:
                    await trainer.wait()
                except ActorFailed as failure:
                    run.death_seen_by_supervisor = failure.error
    finally:
        if engine_ref is None:
            engine_ref, _ = await engine_start
        await engine_ref.stop()
    return run


async def _kept_group_scenario(run: Run, trainer, engine_ref, url: str, hf_dir: Path, work: Path):
    """Three syncs over one EngineSetGroup, then kill -9 and restart of the engine on its port and a
    sync that rebuilds the group. Returns the running engine's ref."""
    _, port = await trainer.ask("weight_master")
    with socket.socket() as squatter:  # what took a free_port() port before the trainer bound it
        try:
            squatter.bind(("127.0.0.1", port))
        except OSError as error:
            run.squatter_errno = error.errno
    group = EngineSetGroup(trainer, "gloo", timeout=120)

    async def sync(session: aiohttp.ClientSession, version: int) -> dict:
        engine = EngineClient(url, session=session)
        info = await engine.get_server_info()
        spec = await group.ensure([engine], [engine_identity(info)], [1], 2)
        run.tensors_sent = await send_weights(trainer, [engine], spec.group_name, str(version), timeout=120)
        run.group["buckets"] = len(await trainer.ask("weight_metadata", timeout=120))
        return info

    async with aiohttp.ClientSession() as session:
        engine = EngineClient(url, session=session)
        # Back to the initial weights, so that only the syncs below can bring the trained ones.
        await engine.update_weights_from_disk(str(hf_dir))
        first = await sync(session, 2)
        await sync(session, 3)
        await sync(session, 4)
        after = await engine.get_server_info()
        run.group |= {"inits_3_syncs": group.inits,
                      "engine_inits_3_syncs": after["weights_update_group_inits"] - first["weights_update_group_inits"],
                      "weights_3_syncs": await _engine_weights(session, url, run.export_dir)}
        pid = after["pid"]
        os.kill(pid, signal.SIGKILL)
        await engine_ref.stop()
        # Its restart on the same port starts now, while the trainer's side of the group notices
        # the dead peer in the next broadcast and drops the group.
        restart = asyncio.ensure_future(start_cpu_engine(hf_dir, work / "logs-restarted", port=int(url.rsplit(":", 1)[1])))
        try:
            try:
                await trainer.ask("broadcast_weights", group.spec.group_name, timeout=120)
            except TrainerOpError as error:
                run.group["dead_broadcast_error"] = str(error)
            run.group["trainer_kept_group"] = await _trainer_has_group(trainer, group.spec.group_name)
        finally:
            engine_ref, _ = await restart  # the caller stops it
        restarted = await sync(session, 6)
        run.group |= {"inits_after_restart": group.inits,
                      "restarted_engine_inits": (await engine.get_server_info())["weights_update_group_inits"],
                      "restarted_engine_weights": await _engine_weights(session, url, run.export_dir),
                      "restarted_pid_differs": restarted["pid"] != pid}
        await group.close([engine])
    return engine_ref


async def _engine_weights(session: aiohttp.ClientSession, url: str, export_dir: Path) -> dict[str, bool]:
    """name -> whether the engine serves exactly the exported tensor."""
    exported = {}
    for path in sorted(export_dir.glob("*.safetensors")):
        exported |= load_file(str(path))
    same = {}
    for name, tensor in exported.items():
        async with session.post(f"{url}/get_weights_by_name", json={"name": name, "truncate_size": 10**9}) as answer:
            served = torch.tensor(await answer.json(), dtype=torch.float32)
        same[name] = torch.equal(served, tensor.to(torch.float32))
    return same


async def _trainer_has_group(trainer, group_name: str) -> bool:
    try:
        await trainer.ask("broadcast_weights", group_name, timeout=120)
    except TrainerOpError as error:
        return "no weight update group" not in str(error)
    return True


async def _dp2_scenario(hf_dir: Path, work: Path) -> Run:
    run = Run()
    config = trainer_config(hf_dir, procs=2, tp=1, use_reference=True)
    async with running_trainer(config, work / "logs") as trainer:
        run.logprobs0, run.entropy0 = await _logprobs(trainer, fixed_batch())
        run.ref_logprobs, _ = await _logprobs(trainer, fixed_batch(), model="ref")
        batch = fixed_batch(old_logprobs=run.logprobs0, ref_logprobs=run.ref_logprobs)
        for _ in range(3):
            run.steps.append(await trainer.ask("train_step", batch, PPO_KL, timeout=None))
        run.ckpt_dir = work / "ckpt"
        await trainer.ask("save", str(run.ckpt_dir), timeout=None)
        run.steps.append(await trainer.ask("train_step", batch, PPO_KL, timeout=None))
        for _ in range(SFT_STEPS):
            metrics = await trainer.ask("train_step", fixed_batch(), SFT, timeout=None)
            run.sft_losses.append(metrics["loss"])
        try:
            await trainer.ask("compute_logprobs", fixed_batch(), model="critic", timeout=None)
        except TrainerOpError as error:
            run.op_error = error
        run.alive_after_op_error = trainer.alive
    return run


async def _resumed_scenario(hf_dir: Path, work: Path, dp2: Run, tp: int = 1, procs: int = 2,
                            teacher: bool = False) -> Run:
    run = Run()
    # teacher: the same checkpoint is also the frozen OPD teacher (a Megatron checkpoint as --opd-teacher-load)
    config = trainer_config(hf_dir, procs=procs, tp=tp, use_reference=True,
                            opd_teacher_load=str(dp2.ckpt_dir) if teacher else None)
    async with running_trainer(config, work / "logs") as trainer:
        if teacher:
            run.logprobs0, _ = await _logprobs(trainer, fixed_batch())
            run.teacher_logprobs, _ = await _logprobs(trainer, fixed_batch(), model="teacher")
        step = await trainer.ask("load", str(dp2.ckpt_dir), timeout=None)
        assert step == 3, f"checkpoint step {step}"
        if teacher:
            run.loaded_logprobs, _ = await _logprobs(trainer, fixed_batch())
        batch = fixed_batch(old_logprobs=dp2.logprobs0, ref_logprobs=dp2.ref_logprobs)
        run.steps.append(await trainer.ask("train_step", batch, PPO_KL, timeout=None))
        # This loss is computed on weights the previous step's Adam update made: it checks the
        # optimizer state too, where the step before depends on the loaded weights alone.
        run.sft_losses.append((await trainer.ask("train_step", fixed_batch(), SFT, timeout=None))["loss"])
    return run


@pytest.fixture(scope="session")
def tp2_run(tiny_hf_dirs, tmp_path_factory) -> Run:
    env_threads()
    return asyncio.run(_tp2_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("tp2")))


@pytest.fixture(scope="session")
def dp2_run(tiny_hf_dirs, tmp_path_factory) -> Run:
    env_threads()
    return asyncio.run(_dp2_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("dp2")))


@pytest.fixture(scope="session")
def resumed_run(tiny_hf_dirs, tmp_path_factory, dp2_run) -> Run:
    env_threads()
    return asyncio.run(_resumed_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("resumed"), dp2_run))


@pytest.fixture(scope="session")
def resumed_at_tp2_run(tiny_hf_dirs, tmp_path_factory, dp2_run) -> Run:
    """dp2_run's checkpoint (TP=1, DP=2) loaded by a TP=2 trainer."""
    env_threads()
    return asyncio.run(_resumed_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("resumed-tp2"), dp2_run, tp=2))


@pytest.fixture(scope="session")
def resumed_alone_run(tiny_hf_dirs, tmp_path_factory, dp2_run) -> Run:
    """dp2_run's checkpoint (2 ranks) loaded by a trainer of one rank."""
    env_threads()
    return asyncio.run(_resumed_scenario(tiny_hf_dirs["qwen2"], tmp_path_factory.mktemp("resumed-1"), dp2_run, procs=1,
                                         teacher=True))


def _max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(r) for r in a] == [len(r) for r in b]
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


# ----- logprobs ------------------------------------------------------------------------------


def test_tp2_logprobs_equal_transformers_recompute_at_the_rollout_temperature(tp2_run, tiny_hf_dirs):
    expected = transformers_logprobs(tiny_hf_dirs["qwen2"], fixed_batch())
    assert _max_abs_diff(tp2_run.logprobs0, expected) < 1e-5


def test_dp2_logprobs_equal_transformers_recompute(dp2_run, tiny_hf_dirs):
    expected = transformers_logprobs(tiny_hf_dirs["qwen2"], fixed_batch())
    assert _max_abs_diff(dp2_run.logprobs0, expected) < 1e-5


def test_reference_logprobs_are_the_initial_weights(tp2_run):
    assert _max_abs_diff(tp2_run.ref_logprobs, tp2_run.logprobs0) == 0.0


def test_entropy_is_positive_and_bounded_by_log_vocab(tp2_run):
    import math

    values = [h for row in tp2_run.entropy0 for h in row]
    assert all(0.0 < h <= math.log(127) + 1e-5 for h in values)


# ----- training ------------------------------------------------------------------------------


def test_event_loop_keeps_ticking_while_a_train_step_is_in_flight(tp2_run):
    assert tp2_run.ticker_finished_first, f"only {tp2_run.ticks} ticks before the train step returned"


def test_train_step_reports_loss_parts_grad_norm_lr_and_clip_fraction(tp2_run):
    metrics = tp2_run.steps[0]
    for key in ("loss", "pg_loss", "kl_loss", "entropy", "pg_clipfrac", "ppo_kl", "grad_norm", "lr", "tis_clipfrac"):
        assert key in metrics, key
    assert metrics["update_successful"] == 1.0
    # Megatron's warmup: lr_warmup_iters=2 from lr_warmup_init=0 to lr=1e-3, stepped after each update.
    assert [round(s["lr"], 9) for s in tp2_run.steps] == [0.0, 0.0005, 0.001, 0.001]


def test_tp2_and_tp1_give_the_same_losses_and_grad_norms_for_three_steps(tp2_run, dp2_run):
    for step, (a, b) in enumerate(zip(tp2_run.steps[:3], dp2_run.steps[:3]), start=1):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5), f"step {step}"
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5), f"step {step}"
        assert a["kl_loss"] == pytest.approx(b["kl_loss"], abs=1e-5), f"step {step}"


def test_training_changes_the_loss_once_the_lr_is_non_zero(tp2_run):
    losses = [s["loss"] for s in tp2_run.steps]
    assert losses[1] == losses[0]  # the first step ran at lr 0 (warmup start)
    assert len(set(losses[1:])) == 3


def test_a_fixed_batch_trained_for_twenty_steps_lowers_the_loss(dp2_run):
    losses = dp2_run.sft_losses
    assert len(losses) == SFT_STEPS
    assert losses[-1] < 0.5 * losses[0]


# ----- checkpoints, export, weight sync ---------------------------------------------------------------


def test_save_new_process_load_gives_the_uninterrupted_next_step_bit_exactly(dp2_run, resumed_run):
    uninterrupted, resumed = dp2_run.steps[3], resumed_run.steps[0]
    assert resumed["loss"] == uninterrupted["loss"]
    assert resumed["grad_norm"] == uninterrupted["grad_norm"]
    assert resumed["lr"] == uninterrupted["lr"]
    assert resumed_run.sft_losses[0] == dp2_run.sft_losses[0]


def test_a_checkpoint_saved_at_tp1_resumes_at_tp2_with_model_optimizer_and_schedule(dp2_run, resumed_at_tp2_run):
    # Resharded: the same next step up to TP's different reduction order.
    uninterrupted, resumed = dp2_run.steps[3], resumed_at_tp2_run.steps[0]
    assert resumed["loss"] == pytest.approx(uninterrupted["loss"], abs=1e-5)
    assert resumed["grad_norm"] == pytest.approx(uninterrupted["grad_norm"], rel=1e-5)
    assert resumed["lr"] == uninterrupted["lr"]
    assert resumed_at_tp2_run.sft_losses[0] == pytest.approx(dp2_run.sft_losses[0], abs=1e-5)


def test_a_megatron_checkpoint_loads_as_the_frozen_opd_teacher_beside_the_policy(dp2_run, resumed_alone_run):
    run = resumed_alone_run
    # The teacher is the checkpoint's weights (what the policy holds once it loads them) ...
    assert _max_abs_diff(run.teacher_logprobs, run.loaded_logprobs) < 1e-5
    # ... while the policy kept its own (the HF start, as dp2's first logprobs) until then.
    assert _max_abs_diff(run.logprobs0, dp2_run.logprobs0) < 1e-5
    assert _max_abs_diff(run.teacher_logprobs, run.logprobs0) > 1e-3


def test_a_checkpoint_of_two_ranks_resumes_on_one(dp2_run, resumed_alone_run):
    # No RNG state for a layout that did not save one; model, optimizer and schedule reshard.
    uninterrupted, resumed = dp2_run.steps[3], resumed_alone_run.steps[0]
    assert resumed["loss"] == pytest.approx(uninterrupted["loss"], abs=1e-5)
    assert resumed["lr"] == uninterrupted["lr"]
    assert resumed_alone_run.sft_losses[0] == pytest.approx(dp2_run.sft_losses[0], abs=1e-5)


def test_exported_hf_checkpoint_loads_in_transformers_and_matches_the_trainer(tp2_run):
    expected = transformers_logprobs(tp2_run.export_dir, fixed_batch())
    assert _max_abs_diff(tp2_run.logprobs_after, expected) < 1e-5
    assert _max_abs_diff(tp2_run.logprobs_after, tp2_run.logprobs0) > 1e-3  # the weights did change


def test_distributed_weight_update_makes_the_cpu_engine_greedy_equal_transformers_on_the_export(tp2_run):
    assert tp2_run.tensors_sent > 0
    assert tp2_run.engine_tokens == transformers_greedy(tp2_run.export_dir, GREEDY_PROMPT, 8)


def test_the_store_port_is_held_by_the_trainer_from_the_moment_it_is_reported(tp2_run):
    # free_port() chose a port and released it; taken by anyone before the trainer's store bound
    # it, the group init failed with EADDRINUSE (a GPU run crashed that way at its 8th sync).
    assert tp2_run.squatter_errno == errno.EADDRINUSE


def test_one_weight_update_group_serves_three_syncs_and_flattened_buckets_arrive_bit_exact(tp2_run):
    group = tp2_run.group
    assert group["inits_3_syncs"] == 1 and group["engine_inits_3_syncs"] == 1
    assert group["buckets"] > 2  # so each sync had a bucket on the wire while the next was gathered
    weights = group["weights_3_syncs"]
    assert weights and all(weights.values()), [name for name, same in weights.items() if not same]


def test_a_broadcast_to_a_killed_engine_fails_and_the_trainer_drops_the_group(tp2_run):
    assert "Connection closed by peer" in tp2_run.group["dead_broadcast_error"]
    assert tp2_run.group["trainer_kept_group"] is False


def test_an_engine_restarted_on_its_port_gets_a_new_group_and_the_exact_weights(tp2_run):
    group = tp2_run.group
    assert group["restarted_pid_differs"]
    assert group["inits_after_restart"] == 2 and group["restarted_engine_inits"] == 1
    weights = group["restarted_engine_weights"]
    assert weights and all(weights.values()), [name for name, same in weights.items() if not same]


def test_an_op_that_raises_on_the_ranks_reports_rank_and_traceback_and_the_trainer_lives_on(dp2_run):
    error = dp2_run.op_error
    assert isinstance(error, TrainerOpError), repr(error)
    assert "trainer rank" in str(error) and "compute_logprobs failed" in str(error)
    assert "model must be 'actor', 'ref' or 'teacher', got 'critic'" in str(error)
    assert dp2_run.alive_after_op_error


# ----- failure ---------------------------------------------------------------------------------------


def test_a_killed_rank_fails_the_pending_call_with_the_rank_and_log_tail(tp2_run):
    error = tp2_run.death_seen_by_call
    assert isinstance(error, TrainerRankDied), repr(error)
    assert error.rank == tp2_run.killed_rank == 1
    assert "trainer rank 1" in str(error)
    assert "last lines of" in str(error) and "trainer-torchrun.log" in str(error)


def test_a_killed_rank_fails_the_trainer_actor_for_its_supervisor(tp2_run):
    error = tp2_run.death_seen_by_supervisor
    assert isinstance(error, TrainerRankDied), repr(error)
    assert error.rank == 1
    print(f"death reported {tp2_run.death_report_s:.2f} s after kill -9")
