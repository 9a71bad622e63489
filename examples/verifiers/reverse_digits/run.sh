#!/usr/bin/env bash
# A verifiers SingleTurnEnv (env.py: reverse a digit string) trained unchanged on CPU: its dataset
# as prompts, its own rollout against the run's router front, its rubric as the reward. Tiny model
# with the tool chat template, a short supervised warm start, then fully-async GRPO + TIS.
# Needs the verifiers extra (pip install -e '.[verifiers]'; the dev extra has it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
.venv/bin/python -c 'import verifiers' 2>/dev/null || .venv/bin/pip install -q -e '.[verifiers]'
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the env: examples.verifiers.reverse_digits.env
started=$(date +%s)
out=runs/verifiers_reverse_digits
rm -rf "$out"
python examples/verifiers/sft_data.py --config examples/verifiers/reverse_digits/env.yaml --out "$out/data"
python -m examples.models.tiny --out "$out/base" --arch qwen2 --seed 0 --chat-template tools --corpus "$out/data/corpus.txt"
slime-async train --config examples/verifiers/reverse_digits/sft.toml
slime-async train --config examples/verifiers/reverse_digits/grpo.toml
python examples/quickstart/report.py "$out/grpo/metrics.jsonl"
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
