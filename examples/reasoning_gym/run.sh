#!/usr/bin/env bash
# reasoning-gym on CPU: a tiny model, reasoning-gym's spell_backward task (words of 3-5 letters)
# written by `slime-async prepare-reasoning-gym`, a supervised warm start, then fully-async GRPO
# whose reward is the task's own scorer. Prints held-out greedy reward before and after RL.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
rm -rf runs/reasoning_gym
python -m examples.models.tiny --out runs/reasoning_gym/base --arch qwen2 --seed 0
slime-async prepare-reasoning-gym --dataset spell_backward --config '{"min_word_len": 3, "max_word_len": 5}' \
  --train-size 4000 --heldout-size 128 --seed 0 --out runs/reasoning_gym/data
slime-async train --config examples/reasoning_gym/sft.toml
slime-async train --config examples/reasoning_gym/grpo.toml
python examples/quickstart/report.py runs/reasoning_gym/grpo/metrics.jsonl
