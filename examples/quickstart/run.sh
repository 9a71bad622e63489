#!/usr/bin/env bash
# The CPU quick start: tiny model + tokenizer, an addition task, a supervised warm start, then
# fully-async GRPO with TIS. Prints held-out reward before and after RL. ~10 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
rm -rf runs/quickstart
python -m examples.models.tiny --out runs/quickstart/base --arch qwen2 --seed 0
python examples/quickstart/make_task.py --out runs/quickstart/data
slime-async train --config examples/quickstart/sft.toml
slime-async train --config examples/quickstart/grpo.toml
python examples/quickstart/report.py runs/quickstart/grpo/metrics.jsonl
