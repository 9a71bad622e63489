"""Supervised fine-tuning with the same trainer (``--loss-type sft``): a warm start before RL.

Each prompt row's label is the target response: prompt ids + label ids + EOS, loss on the
label part only. A label may also be a list of segments ``{"text": str, "train": bool}`` — a
tool-use trace whose tool output the model never writes: each segment is tokenized on its own
(as a generate hook appends a model turn and then an observation) and only ``train`` segments
and the EOS carry loss. No engines are involved; the result is exported with ``--save-hf`` (after
every step when the path holds ``{step}``: one candidate warm start per step).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from policies.algorithm import AlgorithmConfig
from slime_async.actor import ActorRef
from slime_async.batch import batch_from_samples
from slime_async.sample import Sample, Status


def sft_sample(prompt: Any, tokenizer: Any, index: int) -> Sample:
    sample = Sample(group_index=index, index=0, prompt=prompt.prompt, tokens=list(prompt.prompt_ids), label=prompt.label)
    for text, train in label_segments(prompt.label, prompt.index):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if train:
            sample.append_generated(ids, [0.0] * len(ids), version=0)
        else:
            sample.append_observation(ids)
    if tokenizer.eos_token_id is not None:
        sample.append_generated([tokenizer.eos_token_id], [0.0], version=0)
    sample.status = Status.COMPLETED
    return sample


def label_segments(label: Any, row: int) -> list[tuple[str, bool]]:
    """``[(text, trainable)]`` of an SFT label: a plain label is one trainable segment."""
    if not isinstance(label, list):
        return [(str(label), True)]
    segments = []
    for k, segment in enumerate(label):
        if not (isinstance(segment, dict) and isinstance(segment.get("text"), str)
                and isinstance(segment.get("train"), bool)):
            raise ValueError(f"SFT row {row}: label segment {k} must be {{'text': str, 'train': bool}}, got {segment!r}")
        segments.append((segment["text"], segment["train"]))
    return segments


def _absolute(path: str) -> str:
    """``path`` resolved here: the trainer ranks run in the package root (``PACKAGES_ROOT``), so a
    relative --save-hf would land there, not where the user ran the command (as run_checkpoint does)."""
    return str(Path(path).resolve())


async def sft_loop(*, trainer: ActorRef, monitor: ActorRef, dataset: Any, tokenizer: Any, spec: AlgorithmConfig,
                   batch_size: int, total_steps: int, save_hf: str | None) -> int:
    index = 0
    for step in range(1, total_steps + 1):
        started = time.monotonic()
        samples = []
        while len(samples) < batch_size:
            prompt = dataset.next_prompt()
            if prompt is None:
                break
            samples.append(sft_sample(prompt, tokenizer, index))
            index += 1
        if not samples:
            break
        batch = batch_from_samples(samples)
        metrics = await trainer.ask("train_step", batch, spec, timeout=None)
        monitor.tell("log", step, {**{f"train/{k}": v for k, v in metrics.items()},
                                   "perf/step_time": time.monotonic() - started})
        if save_hf and "{step}" in save_hf:
            # One HF export per step: warm-start candidates to measure before RL picks one.
            await trainer.ask("export_hf", _absolute(save_hf.format(step=step)), timeout=None)
    if save_hf and "{step}" not in save_hf:
        await trainer.ask("export_hf", _absolute(save_hf), timeout=None)
    await monitor.ask("flush")
    return 0
