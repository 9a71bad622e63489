"""Helpers for the trainer-actor tests: fixed batches, a transformers recompute, a CPU engine.

Each scenario starts a real torchrun group through `TrainerActor`, drives it over real RPC
from its own event loop (`asyncio.run`), records what the tests assert on, and stops it.
Scenarios run one after another: torch's RPC agent is process-wide.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import torch

from actors.trainer.actor import TrainerActor
from actors.megatron.config import TrainerConfig
from policies.algorithm import AlgorithmConfig
from slime_async.actor import ActorRef, spawn
from slime_async.batch import Batch
from slime_async.process import ProcessChild, ProcessSpec, http_ready
from slime_async.net import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.7

# PPO with the KL loss and an entropy bonus: every loss part and the reference path are used,
# and π_old is fixed, so the loss moves from step to step.
PPO_KL = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
SFT = AlgorithmConfig(loss_type="sft")


def fixed_batch(old_logprobs: list[list[float]] | None = None, ref_logprobs: list[list[float]] | None = None) -> Batch:
    """Six samples of different lengths (ids < 127, the qwen2 tiny vocab); a tool span masked."""
    tokens = [
        [3, 17, 25, 9, 40, 41, 42, 43],
        [5, 6, 7, 100, 101],
        [11, 12, 13, 14, 15, 16, 60, 61, 62, 63, 64],
        [20, 21, 22, 23, 24, 25],
        [8, 30, 31, 32, 33, 34, 35, 36, 37],
        [2, 70, 71],
    ]
    response_lengths = [4, 2, 5, 3, 6, 2]
    loss_masks = [[1] * n for n in response_lengths]
    loss_masks[4][2:4] = [0, 0]  # a tool output inside the response
    advantages = [[a] * n for a, n in zip([1.0, -1.0, 0.5, -0.5, 1.5, -1.5], response_lengths)]
    return Batch(
        tokens=tokens,
        response_lengths=response_lengths,
        loss_masks=loss_masks,
        advantages=advantages,
        rollout_logprobs=old_logprobs,
        old_logprobs=old_logprobs,
        ref_logprobs=ref_logprobs,
        temperature=TEMPERATURE,
    )


def trainer_config(hf_dir: Path, *, procs: int, tp: int, **overrides) -> TrainerConfig:
    megatron = {"tensor_model_parallel_size": tp, "lr": 1e-3, "clip_grad": 1.0, "lr_warmup_iters": 2}
    megatron.update(overrides.pop("megatron", {}))
    return TrainerConfig(
        hf_checkpoint=str(hf_dir),
        actor_num_procs=procs,
        max_tokens_per_gpu=overrides.pop("max_tokens_per_gpu", 24),
        trainer_start_timeout=180.0,
        megatron=megatron,
        **overrides,
    )


@contextlib.asynccontextmanager
async def running_trainer(config: TrainerConfig, log_dir: Path) -> AsyncIterator[ActorRef]:
    ref = await spawn(TrainerActor(config, log_dir))
    try:
        yield ref
    finally:
        await ref.stop()


@torch.no_grad()
def transformers_logprobs(hf_dir: Path, batch: Batch) -> list[list[float]]:
    """log-softmax(logits / T) at each response token, recomputed by transformers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    rows = []
    for tokens, n in zip(batch.tokens, batch.response_lengths):
        logits = model(torch.tensor([tokens])).logits[0].float() / batch.temperature
        logp = torch.log_softmax(logits, dim=-1)
        p = len(tokens) - n
        rows.append([float(logp[p - 1 + t, tokens[p + t]]) for t in range(n)])
    return rows


@torch.no_grad()
def transformers_greedy(hf_dir: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    tokens = list(prompt)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([tokens])).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]




async def start_cpu_engine(model_dir: Path, log_dir: Path, port: int | None = None) -> tuple[ActorRef, str]:
    """The embedded CPU engine as a process child (on ``port``, default a free one); returns
    (its ref, its URL) once healthy."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    spec = ProcessSpec(
        name="cpu-engine",
        argv=[sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir), "--port", str(port)],
        env={"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"},
        cwd=str(REPO_ROOT),
        ready=http_ready(f"{url}/health"),
        ready_timeout=120.0,
    )
    ref = await spawn(ProcessChild(spec, log_dir))
    return ref, url


async def count_ticks_during(coro) -> tuple[object, int, bool]:
    """Run ``coro`` while a ticker yields to the loop; returns (result, ticks done while the
    coroutine was still pending, whether the ticker finished 5 ticks before it completed)."""
    task = asyncio.ensure_future(coro)
    ticks = 0
    while ticks < 5 and not task.done():
        await asyncio.sleep(0)
        ticks += 1
    finished_first = ticks == 5 and not task.done()
    result = await task
    return result, ticks, finished_first


def env_threads() -> None:
    # Trainer ranks, engine and pytest share 2 cores: one intra-op thread each.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# A bare RPC worker (no Megatron) for the bridge tests: joins as "peer" (rank 1 of 2) and
# serves until it is killed. Targets are stdlib functions, importable on both sides.
_PEER_CODE = """
import sys, threading, torch.distributed.rpc as rpc
from slime_async.rpc import backend_options
options = backend_options(sys.argv[1], 60)
rpc.init_rpc("peer", rank=1, world_size=2, rpc_backend_options=options)
threading.Event().wait()
"""


def start_rpc_peer(init_method: str):
    """A subprocess that joins the RPC group at ``init_method`` as worker "peer"."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", _PEER_CODE, init_method], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
