#!/usr/bin/env bash
# Issue #17 item 3 on the device tool's nvidia-h200-x2 host: sync vs one-step-off vs fully-async
# (k = 1, 2, 4; abort / pause / in_place syncs) on the long-tail workloads of
# benchmarks/gpu/longtail.py, SGLang on GPU 0 (started once, reset to the base weights before
# each run), the Megatron trainer on GPU 1, NCCL weight updates. Qwen2.5-0.5B shape, random
# init, the tiny tokenizer's 512-token vocabulary, 32 prompts x 8 samples per step.
#
#   stage-b1 (carry .gpu-wheels/b1):  keeps the b1 wheels in /tmp (bash benchmarks/gpu/h200.sh stage-b1)
#   prep     (carry .gpu-wheels/b2 .gpu-wheels/b6, b6: zstandard):  installs b1 + b2 + b6, writes the model and data, starts SGLang
#            (first launch JIT-compiles ~2.5 min), measures the standalone saturation of both
#            workloads (40 s each); ~6 min
#   runs WORKLOAD RUNS [STEPS] (no carry; the host must still be warm from prep): the named runs
#            (comma-separated: sync, one-step-off, async-k1, async-k2, async-k4, async-k2-pause,
#            async-k2-in_place), one `slime-async train` each, ~2-3 min per run on longtail
#   table    prints both workloads' tables from what the runs left in /tmp/avs/out
# Every run writes a --trace-dir timeline (runs/WORKLOAD/RUN/trace/trace.json), rendered as
# trace_WORKLOAD_RUN.png where matplotlib is installed, else here with benchmarks/render_trace.py.
# Every call copies /tmp/avs/out (the JSON of every phase so far) to $OUT/avs, so the table can
# also be built here: python benchmarks/gpu/async_vs_sync.py --phase table --workload W --out DIR
set -uo pipefail
source benchmarks/gpu/common.sh
URL=http://127.0.0.1:30000
W=/tmp/avs
RESULTS=$W/out
BENCH="python3 benchmarks/gpu/async_vs_sync.py --url $URL --base $W/base --data $W/data --out $RESULTS"
mkdir -p "$RESULTS"
keep() { mkdir -p "$OUT/avs" && cp -r "$RESULTS"/. "$OUT/avs/" 2>/dev/null; cp /tmp/sglang-avs.log "$OUT/" 2>/dev/null; }
trap keep EXIT

case ${1:?phase: stage-b1, prep, runs or table} in
stage-b1)
  mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L
  ;;
prep)
  [ -d /tmp/b1 ] || { echo "b1 is missing: run stage-b1 first (the host went cold between the calls)"; exit 4; }
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl .gpu-wheels/b6/*.whl
  python3 -c "import sglang; print('sglang', sglang.__version__)" || exit 3
  python3 -c "from examples.models.tiny import build_tiny_model as b; b('$W/base', vocab_size=512, \
hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, \
max_position_embeddings=10240, tie_word_embeddings=True)" 2>&1 | tail -1
  python3 examples/quickstart/make_task.py --out $W/data | tail -1
  launch_sglang $W/base 30000 0.7 /tmp/sglang-avs.log
  elapsed "$(wait_sglang $URL 400)"
  for wl in longtail longer-tail; do
    timeout 120 $BENCH --phase standalone --workload $wl --standalone-s 40
  done
  elapsed "prep done"
  ;;
runs)
  [ -d $W/base ] && [ "$(wait_sglang $URL 5)" = "SGLang $URL 200" ] || { echo "no SGLang from prep: the host went cold; run stage-b1 and prep again"; exit 4; }
  timeout ${RUNS_S:-570} $BENCH --phase runs --workload ${2:?workload: longtail or longer-tail} \
    --runs ${3:?runs, comma-separated} --steps ${4:-10} --trainer-gpu 1
  elapsed "runs exit $?"
  for f in $RESULTS/*.log; do grep -q -i "error\|traceback" "$f" && { echo "== $f"; tail -20 "$f"; }; done
  ;;
table)
  for wl in longtail longer-tail; do $BENCH --phase table --workload $wl; done
  ;;
esac
