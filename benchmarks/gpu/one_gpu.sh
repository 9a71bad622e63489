#!/usr/bin/env bash
# Issue #25 on the device tool's one-H200 host: colocated sync (the one-GPU slime baseline) against
# the trainer and SGLang both resident on GPU 0 — sync, one-step-off, fully-async k = 1, 2, 4 with
# abort / drain / in_place / retract syncs — weights by CUDA IPC handles (--update-weight-transport
# tensor), on the long-tail workload of benchmarks/gpu/longtail.py (benchmarks/gpu/async_vs_sync.py
# --layout one-gpu runs them; its table names every column). Qwen2.5-0.5B shape, random init, the
# tiny tokenizer's 512-token vocabulary, 32 prompts x 8 samples per step.
#
# Three calls, each right after the last (the host goes cold 30 s after a call):
#   stage  carry .gpu-wheels/b1 .gpu-wheels/b3 .gpu-wheels/b5  (../shared/gpu/sglang-wheels.sh .gpu-wheels; b3:
#          math-verify, aiorwlock; b5: torch_memory_saver 0.0.10 for --colocate): keeps them in /tmp
#   run1   carry .gpu-wheels/b2 .gpu-wheels/b6 (b6: zstandard, xxhash): installs, writes model and data,
#          starts the shared SGLang (--mem-fraction-static 0.45, CUDA graphs up to batch 256), measures
#          its standalone saturation, then RUNS1
#   run2   (no carry) RUNS2 against the same server, then colocated-sync (which stops the shared server)
# Each call leaves $OUT/one_gpu_<phase>.tgz (the JSON of every run, the logs, the traces and their
# renders) and $OUT/one_gpu_table.md; unpack into benchmarks/gpu/results/.
set -uo pipefail
source benchmarks/gpu/common.sh
URL=http://127.0.0.1:30000
W=/tmp/one_gpu
RESULTS=$W/out
STEPS=${STEPS:-6}
RUNS1=${RUNS1:-sync,async-k2,async-k2-in_place,async-k2-retract}
RUNS2=${RUNS2:-one-step-off,async-k1-in_place,async-k4-in_place,colocated-sync}
export CUDA_GRAPH_MAX_BS=256
BENCH="python3 benchmarks/gpu/async_vs_sync.py --layout one-gpu --url $URL --base $W/base --data $W/data --out $RESULTS \
--workload longtail --trainer-gpu 0 --steps $STEPS"
mkdir -p "$RESULTS"
phase=${1:?phase: stage, run1 or run2}
keep() {
  cp /tmp/sglang-one-gpu.log "$RESULTS/" 2>/dev/null
  tar czf "$OUT/one_gpu_$phase.tgz" -C "$RESULTS" . 2>/dev/null
  $BENCH --phase table > "$OUT/one_gpu_table.md" 2>&1
}
need() { [ -e "$1" ] || { echo "$1 is missing: the host went cold since the last call; start again from stage"; exit 4; }; }

case $phase in
stage)
  mkdir -p /tmp/b1 /tmp/b3 /tmp/b5 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && cp .gpu-wheels/b3/*.whl /tmp/b3/ \
    && cp .gpu-wheels/b5/*.whl /tmp/b5/ && nvidia-smi -L
  ;;
run1)
  trap keep EXIT
  need /tmp/b1; need /tmp/b3; need /tmp/b5
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl /tmp/b3/*.whl /tmp/b5/*.whl .gpu-wheels/b6/*.whl
  python3 -c "import sglang, megatron.core, torch_memory_saver, math_verify; print('sglang', sglang.__version__)" || exit 3
  python3 -c "from examples.models.tiny import build_tiny_model as b; b('$W/base', vocab_size=512, \
hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, \
max_position_embeddings=10240, tie_word_embeddings=True)" 2>&1 | tail -1
  python3 examples/quickstart/make_task.py --out $W/data | tail -1
  launch_sglang $W/base 30000 0.45 /tmp/sglang-one-gpu.log
  elapsed "$(wait_sglang $URL 400)"
  timeout 90 $BENCH --phase standalone --standalone-s 30
  elapsed "standalone done"
  timeout $(( 560 - SECONDS )) $BENCH --phase runs --runs "$RUNS1"
  elapsed "runs exit $?"
  ;;
run2)
  trap keep EXIT
  need $W/base
  [ "$(wait_sglang $URL 5)" = "SGLang $URL 200" ] || { echo "no SGLang from run1: the host went cold; start again from stage"; exit 4; }
  timeout 570 $BENCH --phase runs --runs "$RUNS2"
  elapsed "runs exit $?"
  ;;
esac
for f in "$RESULTS"/*.log; do grep -q -i "error\|traceback" "$f" 2>/dev/null && { echo "== $f"; tail -15 "$f"; }; done
exit 0
