#!/usr/bin/env bash
# On-policy distillation on CPU: the quick start's SFT warm start (student) learns from its GRPO
# result (teacher). Builds what the quick start builds if it is missing, exports the teacher once,
# then trains the student with GRPO + the teacher's reverse KL and prints held-out reward.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
if [ ! -f runs/quickstart/sft-hf/config.json ]; then
  python -m examples.models.tiny --out runs/quickstart/base --arch qwen2 --seed 0
  python examples/quickstart/make_task.py --out runs/quickstart/data
  slime-async train --config examples/quickstart/sft.toml
fi
if [ ! -f runs/quickstart/grpo-hf/config.json ]; then
  slime-async train --config examples/quickstart/grpo.toml --save runs/quickstart/grpo-checkpoints --save-hf runs/quickstart/grpo-hf
fi
rm -rf runs/opd/student
slime-async train --config examples/on_policy_distillation/opd.toml
python examples/quickstart/report.py runs/opd/student/metrics.jsonl
