#!/usr/bin/env bash
# The OpenAI-client agent example on CPU: the code-interpreter task as an openai tool-calling
# loop, trained through the router front's trajectory capture. Tiny model with the tool chat
# template, a short supervised warm start on rendered episodes, then fully-async GRPO + TIS.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the hook: examples.agentic.openai_agent.agent
started=$(date +%s)
rm -rf runs/openai_agent
python examples/agentic/openai_agent/make_task.py --out runs/openai_agent/data
python -m examples.models.tiny --out runs/openai_agent/base --arch qwen2 --seed 0 --chat-template tools \
  --corpus runs/openai_agent/data/corpus.txt
slime-async train --config examples/agentic/openai_agent/sft.toml
slime-async train --config examples/agentic/openai_agent/grpo.toml
python examples/agentic/code_interpreter/report.py runs/openai_agent/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
