#!/usr/bin/env bash
# Solver -> critic -> revision on CPU: digit reversal, tiny model, a short SFT warm start on
# three-role traces, then fully-async GRPO rewarded on the revised answer.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the hook: examples.agentic.multi_agent.agent
start=$(date +%s)
rm -rf runs/agentic/multi_agent
python examples/agentic/multi_agent/prepare.py --out runs/agentic/multi_agent/data
python -m examples.models.tiny --out runs/agentic/multi_agent/base --arch qwen2 --seed 0 \
  --corpus runs/agentic/multi_agent/data/tokenizer_corpus.txt
slime-async train --config examples/agentic/multi_agent/sft.toml
slime-async train --config examples/agentic/multi_agent/grpo.toml
python examples/agentic/multi_agent/report.py runs/agentic/multi_agent/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - start )) s; load: $(uptime | sed 's/.*load average/load average/')"
