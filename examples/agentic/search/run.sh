#!/usr/bin/env bash
# Search-R1-style agent on CPU: corpus + questions, tiny model with a tokenizer trained on the
# task's text, a short SFT warm start on search traces, then synchronous GRPO with the search hook.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the hook: examples.agentic.search.agent
start=$(date +%s)
rm -rf runs/agentic/search
python examples/agentic/search/prepare.py --out runs/agentic/search/data
python -m examples.models.tiny --out runs/agentic/search/base --arch qwen2 --seed 0 --vocab-size 1024 \
  --corpus runs/agentic/search/data/tokenizer_corpus.txt
slime-async train --config examples/agentic/search/sft.toml
slime-async train --config examples/agentic/search/grpo.toml
python examples/agentic/search/report.py runs/agentic/search/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - start )) s; load: $(uptime | sed 's/.*load average/load average/')"
