#!/usr/bin/env bash
# The GPU acceptance runs of issues #3 and #4, on the device tool's nvidia-h200-x2 host
# (2 H200s, offline, python3 with torch 2.11+cu130). Wheels come from
# ../shared/gpu/sglang-wheels.sh .gpu-wheels, plus .gpu-wheels/b0 (megatron-core, orjson and
# pytest-asyncio copied from b2, and aiorwlock) so the trainer phase runs before SGLang is installed.
#
#   phase 1 "trainer" (carry .gpu-wheels/b1 .gpu-wheels/b0): trainer tokens/s + MFU for the
#           0.5B (GPU 0) and 1.5B (GPU 1) shapes side by side, the RPC overhead, and 1.5B at
#           TP=2 over both GPUs (NCCL tensor parallelism); keeps b1
#           in /tmp for phase 2, which must follow within the 30 s the host stays warm.
#   phase 2 "sglang" (carry .gpu-wheels/b2): installs SGLang 0.5.17, serves the 0.5B shape on
#           GPU 0, then client overhead vs native batch, concurrency scaling, the bf16
#           SGLang-vs-trainer logprob mismatch (trainer on GPU 1), and the contract suite with
#           NCCL weight updates from GPU 1 (NCCL_CUMEM_ENABLE=0 on both sides, as required).
#   phase "rl" (after stage-b1, carry .gpu-wheels/b2): a short synchronous GRPO run of the whole
#           runtime on GPU (rl_sync_sglang.toml): SGLang launched by the runtime, NCCL updates.
#   phase "weight-sync SHAPE" (after stage-b1, carry .gpu-wheels/b2; SHAPE qwen2.5-0.5b or
#           qwen2.5-1.5b): SGLang serves the shape on GPU 0, a trainer rank on GPU 1 syncs it
#           pause->resume per tensor vs flattened buckets over the kept group, and the raw NCCL
#           broadcast bandwidth GPU 1 -> GPU 0 in the same run (weight_sync.py).
#   phase "kernels" (carry .gpu-wheels/b2 .gpu-wheels/b3; one GPU or two): trainer tokens/s and
#           MFU, old path (padded, full logits) vs new (packed varlen, chunked head), and packed
#           attention per sequence vs one varlen call, for the 0.5B and 1.5B shapes, plus the
#           0.5B shape on a long-tail batch (10% at 2048 tokens, the rest 128) with two GPUs.
# Every phase that carries .gpu-wheels/b2 also carries .gpu-wheels/b6 (zstandard 0.25.0 for cp312:
# the delta codec's pin in setup.cfg, which no other batch holds; missing, the runtime fails at start).
# Results land in $OUT; benchmarks/gpu/results/ keeps the copies.
set -uo pipefail
source benchmarks/gpu/common.sh
URL=http://127.0.0.1:30000

case ${1:?phase: stage-b1, trainer, sglang, rl, weight-sync or kernels} in
stage-b1)  # only keep b1 for the sglang phase
  mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L
  ;;
trainer)
  mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/
  pipi .gpu-wheels/b0/*.whl
  nvidia-smi -L
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/gpu/trainer_throughput.py --shape qwen2.5-0.5b \
    > "$OUT/trainer_0.5b.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=1 timeout 300 python3 benchmarks/gpu/trainer_throughput.py --shape qwen2.5-1.5b \
    > "$OUT/trainer_1.5b.txt" 2>&1 &
  wait
  elapsed "throughput done"
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/trainer_overhead.py --hidden 896 --layers 24 \
    --vocab 151936 --samples 16 --seq-len 2048 --max-tokens 8192 --steps 5 > "$OUT/trainer_overhead.txt" 2>&1
  elapsed "overhead done"
  timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/gpu/trainer_throughput.py \
    --shape qwen2.5-1.5b --tp 2 > "$OUT/trainer_1.5b_tp2.txt" 2>&1
  elapsed "TP=2 done"
  for f in "$OUT"/trainer_*.txt; do echo "== $f"; grep -v -i -E "warn|^\s*$" "$f" | tail -14; done
  ;;
sglang)
  [ -d /tmp/b1 ] || { echo "b1 is missing: the host went cold between the phases"; exit 4; }
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl .gpu-wheels/b6/*.whl
  python3 -c "import sglang; print('sglang', sglang.__version__)" || exit 3
  python3 -c "from pathlib import Path; from benchmarks.gpu.qwen_shapes import write_random_model as w; \
w(Path('/tmp/m05'), 'qwen2.5-0.5b', norm_scale=10.0)" 2>&1 | tail -1
  launch_sglang /tmp/m05 30000 0.6 /tmp/sglang.log
  elapsed "$(wait_sglang $URL 330)"
  timeout 150 python3 benchmarks/engine_throughput.py --url $URL --compare-native --vocab-size 151936 \
    --compare-requests 256 --prompt-len 64 --max-new-tokens 1024 --repeats 3 > "$OUT/engine_compare.txt" 2>&1
  timeout 60 python3 benchmarks/engine_throughput.py --url $URL --vocab-size 151936 > "$OUT/engine_scaling.txt" 2>&1
  elapsed "engine benchmarks done"
  CUDA_VISIBLE_DEVICES=1 timeout 150 python3 benchmarks/gpu/logprob_mismatch.py --url $URL --model-dir /tmp/m05 \
    > "$OUT/logprob_mismatch.txt" 2>&1
  elapsed "mismatch done"
  SLIME_ASYNC_TEST_ENGINE_URL=$URL SLIME_ASYNC_TEST_ENGINE_MODEL=/tmp/m05 SLIME_ASYNC_TEST_WEIGHT_BACKEND=nccl \
  SLIME_ASYNC_TEST_TRAINER_GPU=1 SLIME_ASYNC_TEST_LOGPROB_ATOL=${ATOL:-0.5} \
    timeout ${CONTRACT_S:-270} python3 -m pytest -q -p no:cacheprovider tests/contract -rA --timeout 150 \
    ${K:+-k "$K"} > "$OUT/contract.txt" 2>&1
  elapsed "contract done"
  cp /tmp/sglang.log "$OUT/"
  for f in engine_compare engine_scaling logprob_mismatch; do echo "== $f"; grep -v -i -E "warn" "$OUT/$f.txt" | tail -12; done
  grep -E "PASSED|FAILED|ERROR|SKIPPED|XFAIL|passed|failed|difference at|^E  " "$OUT/contract.txt" | tail -60
  ;;
rl)  # after stage-b1 (carry .gpu-wheels/b2): the whole loop on GPU, see rl_sync_sglang.toml
  [ -d /tmp/b1 ] || { echo "b1 is missing: the host went cold between the phases"; exit 4; }
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl .gpu-wheels/b6/*.whl
  python3 -c "from examples.models.tiny import build_tiny_model as b; b('/tmp/rl/base', vocab_size=512, \
hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, \
max_position_embeddings=4096, tie_word_embeddings=True)" 2>&1 | tail -1
  python3 examples/quickstart/make_task.py --out /tmp/rl/data | tail -1
  timeout ${RL_S:-500} python3 -m actors.loop.cli train --config benchmarks/gpu/rl_sync_sglang.toml > "$OUT/rl.log" 2>&1
  elapsed "rl exit $?"
  cp /tmp/rl/run/metrics.jsonl "$OUT/rl_metrics.jsonl" 2>/dev/null
  python3 - "$OUT/rl_metrics.jsonl" <<'PY'
import json, sys
keys = ["train/logprob_abs_diff", "train/grad_norm", "rollout/reward_mean", "perf/weight_sync_time",
        "perf/train_time", "perf/step_time", "perf/rollout_tokens_per_s"]
print("| step | " + " | ".join(k.split("/")[1] for k in keys) + " |")
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "train/step" in row:
        print(f"| {row['step']} | " + " | ".join(f"{row.get(k, float('nan')):.4g}" for k in keys) + " |")
PY
  grep -v -i -E "warn" "$OUT/rl.log" | tail -25
  ;;
weight-sync)  # after stage-b1 (carry .gpu-wheels/b2): bash benchmarks/gpu/h200.sh weight-sync qwen2.5-1.5b
  [ -d /tmp/b1 ] || { echo "b1 is missing: the host went cold between the phases"; exit 4; }
  SHAPE=${2:-qwen2.5-1.5b}
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl .gpu-wheels/b6/*.whl
  python3 -c "from pathlib import Path; import sys; from benchmarks.gpu.qwen_shapes import write_random_model as w; \
w(Path('/tmp/ws-$SHAPE'), '$SHAPE')" 2>&1 | tail -1
  launch_sglang /tmp/ws-$SHAPE 30000 0.5 /tmp/sglang-ws.log
  SGLANG_PID=$!
  elapsed "$(wait_sglang $URL 330)"
  CUDA_VISIBLE_DEVICES=1 timeout ${WS_S:-240} python3 benchmarks/gpu/weight_sync.py --shape "$SHAPE" \
    --model-dir /tmp/ws-$SHAPE --url $URL --peer-gpu 0 > "$OUT/weight_sync_$SHAPE.txt" 2>&1
  elapsed "weight sync exit $?"
  kill -TERM -- -"$SGLANG_PID" 2>/dev/null
  cp /tmp/sglang-ws.log "$OUT/"
  grep -v -i -E "warn" "$OUT/weight_sync_$SHAPE.txt" | tail -12
  ;;
kernels)  # carry .gpu-wheels/b2 .gpu-wheels/b3: bash benchmarks/gpu/h200.sh kernels
  python3 -c "import megatron.core, orjson, aiorwlock" 2>/dev/null ||  # installed by an earlier phase here
    pipi .gpu-wheels/b2/megatron_core-*.whl .gpu-wheels/b2/orjson-*.whl .gpu-wheels/b3/aiorwlock-*.whl
  python3 -c "import torch, inspect; from torch.nn.attention.varlen import varlen_attn as v; \
print('torch', torch.__version__, 'varlen_attn', inspect.signature(v))" 2>&1 | tail -1
  GPUS=$(nvidia-smi -L | wc -l)
  # One GPU runs the shapes in turn (the long-tail run only with two GPUs): each call <= 600 s.
  LIMIT=${KERNELS_S:-$([ "$GPUS" -gt 1 ] && echo 270 || echo 280)}
  kernels_run() { CUDA_VISIBLE_DEVICES=$1 timeout $LIMIT python3 benchmarks/gpu/trainer_throughput.py --shape $2 \
    --seq-lens ${SEQ_LENS:-2048} "${@:4}" > "$OUT/trainer_kernels_$3.txt" 2>&1; }
  if [ "$GPUS" -gt 1 ]; then
    { kernels_run 0 qwen2.5-0.5b 0.5b; kernels_run 0 qwen2.5-0.5b 0.5b_longtail --long-tail 0.1 --attention-tokens 0; } &
    kernels_run 1 qwen2.5-1.5b 1.5b --profile &  # the MFU-goal shape: where the time goes
    wait
  else
    kernels_run 0 qwen2.5-0.5b 0.5b; kernels_run 0 qwen2.5-1.5b 1.5b --profile
  fi
  # The tables and parity lines (the profiles stay in the files).
  for f in "$OUT"/trainer_kernels_*.txt; do echo "== $f"; grep -E "^\| |variant|matmul peak|logprobs at|packed attention|^  +(loop|varlen)|max \||Error|error" "$f" | grep -v -i warn | tail -30; done
  ;;
esac
