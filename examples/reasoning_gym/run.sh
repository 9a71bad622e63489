#!/usr/bin/env bash
# reasoning-gym on CPU: a tiny model, reasoning-gym's rotate_matrix task (2x2 digit matrices turned
# 90 degrees clockwise) written by `slime-async prepare-reasoning-gym`, a supervised warm start,
# then fully-async GRPO whose reward is the task's own scorer. Prints held-out greedy reward
# before and after RL.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
started=$(date +%s)
out=runs/reasoning_gym
rm -rf "$out"
slime-async prepare-reasoning-gym --dataset rotate_matrix \
  --config '{"min_n": 2, "max_n": 2, "min_rotations": 1, "max_rotations": 1}' \
  --train-size 4000 --heldout-size 128 --seed 0 --out "$out/data"
# The tokenizer learns the task's text (prompt and label of each training row), so the template's
# words are single tokens and the prompt is 64 tokens (148 with the built-in corpus).
python -c "import json, sys; [print(r['prompt'] + r['label']) for r in map(json.loads, open(sys.argv[1]))]" \
  "$out/data/train.jsonl" > "$out/data/corpus.txt"
python -m examples.models.tiny --out "$out/base" --arch qwen2 --seed 0 --corpus "$out/data/corpus.txt"
slime-async train --config examples/reasoning_gym/sft.toml
slime-async train --config examples/reasoning_gym/grpo.toml
python examples/quickstart/report.py "$out/grpo/metrics.jsonl"
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
