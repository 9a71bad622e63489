#!/usr/bin/env bash
# A verifiers ToolEnv (env.py: arithmetic with a calculator tool) trained unchanged on CPU: its dataset
# as prompts, its own rollout against the run's router front, its rubric as the reward. Tiny model
# with the tool chat template, a short supervised warm start, then fully-async GRPO + TIS.
# Needs the verifiers extra (pip install -e '.[verifiers]'; the dev extra has it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
.venv/bin/python -c 'import verifiers' 2>/dev/null || .venv/bin/pip install -q -e '.[verifiers]'
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the env: examples.verifiers.calculator.env
started=$(date +%s)
out=runs/verifiers_calculator
rm -rf "$out"
python examples/verifiers/sft_data.py --config examples/verifiers/calculator/env.yaml --out "$out/data"
python -m examples.models.tiny --out "$out/base" --arch qwen2 --seed 0 --chat-template tools --corpus "$out/data/corpus.txt"
slime-async train --config examples/verifiers/calculator/sft.toml
slime-async train --config examples/verifiers/calculator/grpo.toml
python examples/agentic/code_interpreter/report.py "$out/grpo/metrics.jsonl" --tool-metric total_tool_calls
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
