"""GPU check of PPO's critic group (issue 12): a policy group and a critic group of one rank each
in one TrainerActor on a one-GPU host (the critic shares GPU 0), driven as the loop drives them.

    python3 benchmarks/gpu/critic_smoke.py WORK_DIR     (prints one JSON line; exit 1 if a check fails)

Checks: the zero value head answers 0 for every response token; policy logprobs come back beside
it; six critic steps on a fixed batch lower the value loss; a policy step and a critic step run
concurrently; a critic save / load repeats the step taken after the save.

Seen on one H200 (2026-12-01, torch 2.11.0+cu130, megatron-core 0.16.1 carried from
.gpu-wheels/b2): everything up to the save ran, then save_critic failed in megatron's
Float16OptimizerWithFloat16Params.sharded_state_dict: "Optimizer shape ((64,) does not match model
shape ((128,))". On CUDA the model is bf16 but the local layer spec's norm weights stay fp32 (checked
on CPU with --bf16: input_layernorm, pre_mlp_layernorm and final_layernorm are float32), and that
optimizer numbers its float16 params apart from its fp32 ones: the likely cause (ids that shift). The policy's save
takes the same path and was not run on a GPU either. On CPU (fp32) the script passes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "trainer"))

from conftest import build_tiny_hf_model  # noqa: E402  (the trainer tests' tiny checkpoints)
from worker_fixtures import PPO_KL, fixed_batch, trainer_config  # noqa: E402

from actors.trainer.actor import TrainerActor  # noqa: E402
from slime_async.actor import spawn  # noqa: E402

REWARDS = [1.0, -1.0, 0.5, -0.5, 1.5, -1.5]


async def main(work: Path) -> dict:
    hf = build_tiny_hf_model(work / "qwen2", "qwen2")
    policy = trainer_config(hf, procs=1, tp=1, use_reference=True)
    critic = trainer_config(hf, procs=1, tp=1, megatron={"lr": 1e-2, "lr_warmup_iters": 0})
    ref = await spawn(TrainerActor(policy, work / "logs", critic=critic, critic_first_gpu=0))
    out: dict = {}
    try:
        batch = fixed_batch()
        values0 = await ref.ask("compute_values", batch, timeout=None)
        logprobs = await ref.ask("compute_logprobs", batch, timeout=None)
        returns = [[r] * n for r, n in zip(REWARDS, batch.response_lengths)]
        targets = dataclasses.replace(batch, values=values0, returns=returns)
        losses = [(await ref.ask("train_critic", targets, 10.0, "token_mean", timeout=None))["value_loss"]
                  for _ in range(6)]
        old = [row.logprobs for row in logprobs]
        policy_batch = dataclasses.replace(batch, old_logprobs=old, rollout_logprobs=old,
                                           ref_logprobs=[r.logprobs for r in await ref.ask(
                                               "compute_logprobs", batch, model="ref", timeout=None)])
        policy_step, critic_step = await asyncio.gather(
            ref.ask("train_step", policy_batch, PPO_KL, timeout=None),
            ref.ask("train_critic", targets, 10.0, "token_mean", timeout=None))
        await ref.ask("save_critic", str(work / "critic"), timeout=None)
        after_save = await ref.ask("train_critic", targets, 0.05, "token_mean", timeout=None)
        await ref.ask("load_critic", str(work / "critic"), timeout=None)
        after_load = await ref.ask("train_critic", targets, 0.05, "token_mean", timeout=None)
        out = {
            "values0_all_zero": all(v == 0.0 for row in values0 for v in row),
            "logprobs_negative": all(v < 0 for row in logprobs for v in row.logprobs),
            "value_losses": losses,
            "policy_step_loss": policy_step["loss"], "concurrent_critic_loss": critic_step["value_loss"],
            "after_save": after_save["value_loss"], "after_load": after_load["value_loss"],
        }
        out["ok"] = (out["values0_all_zero"] and out["logprobs_negative"] and losses[-1] < 0.5 * losses[0]
                     and abs(after_save["value_loss"] - after_load["value_loss"]) <= 1e-5 * abs(after_save["value_loss"]))
    finally:
        await ref.stop()
    return out


if __name__ == "__main__":
    result = asyncio.run(main(Path(sys.argv[1])))
    print(json.dumps(result))
    sys.exit(0 if result.get("ok") else 1)
