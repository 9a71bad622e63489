#!/usr/bin/env bash
# GPU run of the SmolLM2 math example on ONE GPU (an H200 here): SGLang serves the bf16
# checkpoint as an external engine and the one-rank Megatron trainer shares the GPU with it;
# fully-async GRPO with TIS, weights synced from disk, held-out greedy accuracy every 10 steps.
# Prints held-out accuracy at the start and the end, overall and per level.
#
#   bash examples/smollm2_math/run_gpu.sh                 # GPU 0, port 30000
#   GPU=1 PORT=30001 bash examples/smollm2_math/run_gpu.sh --num-rollout 50
#
# Needs a CUDA torch and the project with its gpu and models extras in $PYTHON's environment
# (pip install -e '.[gpu,models]'). Extra arguments go to `slime-async train`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
GPU=${GPU:-0}
PORT=${PORT:-30000}
URL=http://127.0.0.1:$PORT
ROOT=runs/smollm2_math
RUN=$ROOT/gpu
export CUDA_VISIBLE_DEVICES=$GPU
export NCCL_CUMEM_ENABLE=${NCCL_CUMEM_ENABLE:-0}

"$PYTHON" -c "import torch, sglang, megatron.core, math_verify; assert torch.cuda.is_available()" 2>/dev/null \
  || { echo "run_gpu.sh: $PYTHON needs a CUDA torch that sees a GPU and pip install -e '.[gpu,models]'" >&2; exit 2; }

"$PYTHON" examples/smollm2_math/prepare.py --out "$ROOT" --dtype bfloat16
rm -rf "$RUN" && mkdir -p "$RUN"

# SGLang, built the way the runtime builds it, on the trainer's GPU: 35% of the GPU's memory for
# its weights and KV cache, the rest for the trainer. The triton attention and pytorch sampling
# backends run on SGLang builds without FlashAttention-3/FlashInfer (a full install needs neither).
mapfile -t SGLANG < <("$PYTHON" - "$PWD/$ROOT/model" "$PORT" <<'PY'
import sys
from actors.engine.sglang import build_sglang_argv
argv = build_sglang_argv(sys.argv[1], port=int(sys.argv[2]), python=sys.executable, passthrough={
    "attention_backend": "triton", "sampling_backend": "pytorch", "mem_fraction_static": 0.35,
    "log_level": "warning"})
print("\n".join(argv))
PY
)
echo "SGLang: ${SGLANG[*]}  (log $ROOT/sglang.log)"
setsid "${SGLANG[@]}" > "$ROOT/sglang.log" 2>&1 < /dev/null &
SGLANG_PID=$!
# SGLang's scheduler and detokenizer are its children: stop the whole process group.
trap 'kill -TERM -- -$SGLANG_PID 2>/dev/null; sleep 5; kill -KILL -- -$SGLANG_PID 2>/dev/null || true' EXIT

"$PYTHON" - "$URL" "$SGLANG_PID" <<'PY'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.time() + 600  # a first launch JIT-compiles kernels for minutes
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit("run_gpu.sh: SGLang exited before it was ready; see runs/smollm2_math/sglang.log")
    try:
        with urllib.request.urlopen(url + "/health_generate", timeout=60) as response:
            if response.status == 200:
                print(f"SGLang ready at {url}")
                sys.exit(0)
    except OSError:
        time.sleep(2)
sys.exit(f"run_gpu.sh: SGLang at {url} not ready within 600 s; see runs/smollm2_math/sglang.log")
PY

# Per-level held-out accuracy before and after (the run logs the overall one): greedy through
# the same SGLang, which holds the run's last weights once training ends.
levels() {
  "$PYTHON" examples/smollm2_math/baseline.py --model "$ROOT/model" --data "$ROOT/data/heldout.jsonl" --url "$URL" \
    --max-new-tokens 128 2>/dev/null | tee "$ROOT/gpu_levels_$1.txt"
}
levels start
"$PYTHON" -m actors.loop.cli train --config examples/smollm2_math/gpu.toml \
  --rollout-external-engine-addrs "$URL" "$@"
levels end
"$PYTHON" examples/smollm2_math/report.py "$RUN/metrics.jsonl"
echo "TensorBoard: tensorboard --logdir $RUN/tb"
