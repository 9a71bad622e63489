#!/usr/bin/env bash
# The code-interpreter example on CPU: tiny model + tokenizer trained on the task's text, the
# arithmetic task, a short supervised warm start on tool-use traces, then fully-async GRPO + TIS
# with the sandbox running the model's code. Prints held-out reward before and after RL.
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the hook: examples.agentic.code_interpreter.agent
started=$(date +%s)
rm -rf runs/code_interpreter
python examples/agentic/code_interpreter/make_task.py --out runs/code_interpreter/data
python -m examples.models.tiny --out runs/code_interpreter/base --arch qwen2 --seed 0 \
  --corpus runs/code_interpreter/data/corpus.txt
slime-async train --config examples/agentic/code_interpreter/sft.toml
slime-async train --config examples/agentic/code_interpreter/grpo.toml
python examples/agentic/code_interpreter/report.py runs/code_interpreter/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
