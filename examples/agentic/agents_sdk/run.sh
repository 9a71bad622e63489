#!/usr/bin/env bash
# The OpenAI Agents SDK example on CPU: the code-interpreter task as an Agents SDK agent (a
# function tool, Runner.run), trained unchanged through the router front's trajectory capture.
# Needs the agents-sdk extra (pip install -e '.[agents-sdk]'). Tiny model with the tool chat
# template, a short supervised warm start on rendered episodes, then fully-async GRPO + TIS.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
.venv/bin/python -c 'import agents' 2>/dev/null || .venv/bin/pip install -q -e '.[agents-sdk]'
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the hook: examples.agentic.agents_sdk.agent
started=$(date +%s)
rm -rf runs/agents_sdk
python examples/agentic/agents_sdk/make_task.py --out runs/agents_sdk/data
python -m examples.models.tiny --out runs/agents_sdk/base --arch qwen2 --seed 0 --chat-template tools \
  --corpus runs/agents_sdk/data/corpus.txt
slime-async train --config examples/agentic/agents_sdk/sft.toml
slime-async train --config examples/agentic/agents_sdk/grpo.toml
python examples/agentic/code_interpreter/report.py runs/agents_sdk/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
