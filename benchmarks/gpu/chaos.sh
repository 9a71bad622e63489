#!/usr/bin/env bash
# Issue #29 item 1: chaos against real SGLang on ONE GPU, one fault per run (benchmarks/gpu/chaos.py:
# the faults, the table's columns; the same logic against the CPU engine in
# tests/benchmarks/test_chaos_driver.py). The Megatron trainer and the run's own SGLang engine are
# both resident on GPU 0 (--rollout-share-trainer-gpus, SGLang at --mem-fraction-static 0.35), weights
# by disk (CUDA IPC for kill9-engine-tensor-update); restart-external-engine runs SGLang itself on
# GPU 0, gives it to the run as --rollout-external-engine-addrs, kills it after step 2 and starts it
# again on its port. Synchronous GRPO on the Qwen2.5-0.5B shape (random init, the tiny tokenizer's
# 512-token vocabulary), 32 prompts x 8 samples x <= 64 tokens, STEPS=5, the fault after step 2.
#
# Calls (each <= 570 s; the host goes cold ~30 s after a call, and with it /tmp and SGLang's JIT cache):
#   stage  carry .gpu-wheels/b1                  (../shared/gpu/sglang-wheels.sh .gpu-wheels), unless SGLang
#   run    carry .gpu-wheels/b2 .gpu-wheels/b6   is installed already; later run calls need no carry
# A run call runs the faults of FAULTS (default: all) that have no row yet, in order: a fault is not
# started with less than MIN_FAULT_S (200) left in the call's BUDGET_S (570), and one still going at
# the end is stopped whole, its row saying it was cut (it runs again in the next call). So the same
# `bash benchmarks/gpu/chaos.sh run`, repeated on the warm host, finishes the table. Rows accumulate
# in /tmp/chaos/results, which starts from benchmarks/gpu/results/chaos/chaos.jsonl when the repo has it
# (a later session's fresh host runs only the faults left); every call copies the table so far to
# $OUT/chaos.md (rows: chaos.jsonl) and
# the logs to $OUT/chaos_logs.tgz (<fault>.log the run's console, logs/<fault>/ its children's,
# <fault>.engine.log the external SGLang's); unpack into benchmarks/gpu/results/chaos/ and put the
# table in docs/reliability.md.
#
#   cpu    the same argument list against the embedded CPU engine with a tiny model and small sizes
#          (no GPU, no SGLang): the GPU argument list is parsed first, then FAULTS run (default
#          none,restart-external-engine) with the CPU engine as the external one. On a CPU host:
#          PYTHON=/path/to/venv/bin/python bash benchmarks/gpu/chaos.sh cpu
set -uo pipefail
PY=${PYTHON:-python3}
W=/tmp/chaos
R=$W/results
STEPS=${STEPS:-5}
BATCH=${BATCH:-32} SAMPLES=${SAMPLES:-8} LEN=${LEN:-64}
ALL=none,kill9-engine-generating,kill9-engine-disk-update,kill9-engine-paused-in-place,kill9-engine-tensor-update,\
sigstop-engine,kill9-trainer-rank-update,restart-external-engine
# The run's own engine. No CUDA graphs: a fault restarts SGLang, and the engine's start is most of
# each fault's time; the tiny vocabulary's batches are fast enough without them.
ENGINE_GPU=(--engine-type sglang --rollout-share-trainer-gpus --engine-start-timeout 300
  --sglang-mem-fraction-static 0.35 --sglang-attention-backend triton --sglang-sampling-backend pytorch
  --sglang-disable-cuda-graph --sglang-log-level warning)

# train_flags MODEL DATA: every fault's train flags but the engine's, into TRAIN.
train_flags() {
  TRAIN=(--hf-checkpoint "$1" --prompt-data "$2" --rollout-batch-size "$BATCH" --n-samples-per-prompt "$SAMPLES"
    --rollout-max-response-len "$LEN" --rollout-temperature 1.0 --rm-type exact --advantage-estimator grpo --lr 1e-5
    --router-health-interval 1 --router-health-failures 2 --router-no-engine-timeout 300)
}

# chaos_argv ENGINE_KIND: the driver over FAULTS (rows to $R) with TRAIN and ENGINE, into CHAOS.
chaos_argv() {
  CHAOS=("$PY" -m benchmarks.gpu.chaos --out "$R" --faults "$FAULTS" --steps "$STEPS" --fault-after 2
    --stop-seconds "${STOP_S:-60}" --timeout "${RUN_TIMEOUT_S:-420}" --deadline-s "$DEADLINE_S"
    --min-fault-s "${MIN_FAULT_S:-200}" --skip-done --external-engine "$1" -- "${TRAIN[@]}" "${ENGINE[@]}")
}

keep() {
  cp "$R/chaos.md" "$R/chaos.jsonl" "$OUT/" 2>/dev/null
  tar czf "$OUT/chaos_logs.tgz" -C "$R" --exclude=runs --exclude=running.json . 2>/dev/null
  elapsed "kept the results in $OUT"
}

case ${1:?phase: stage, run or cpu} in
stage)
  source benchmarks/gpu/common.sh
  mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L
  ;;
run)
  source benchmarks/gpu/common.sh
  FAULTS=${FAULTS:-$ALL}
  mkdir -p "$R"
  # Rows an earlier session brought back count as done: a fresh host continues the table.
  [ -f "$R/chaos.jsonl" ] || cp benchmarks/gpu/results/chaos/chaos.jsonl "$R/" 2>/dev/null
  trap keep EXIT
  install_sglang
  [ -f $W/base/config.json ] || write_qwen05_shape $W/base 4096
  [ -f $W/data/train.jsonl ] || python3 examples/quickstart/make_task.py --out $W/data | tail -1
  elapsed "prepared"
  # The driver stops itself 45 s before the call's limit (a run's SIGTERM, then SIGKILL, takes up to
  # 30 s); `timeout` is the backstop (SIGTERM: the driver cuts the run in hand and writes its row).
  DEADLINE_S=$(( ${BUDGET_S:-570} - SECONDS - 45 ))
  train_flags $W/base $W/data/train.jsonl
  ENGINE=("${ENGINE_GPU[@]}")
  chaos_argv sglang
  timeout -k 10 $(( ${BUDGET_S:-570} - SECONDS - 15 )) "${CHAOS[@]}"
  elapsed "chaos exit $?"
  cat "$R/chaos.md" 2>/dev/null
  ;;
cpu)
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  OUT=${OUT:-$W/cpu-out} W=$W/cpu
  R=$W/results
  FAULTS=${FAULTS:-none,restart-external-engine} DEADLINE_S=0
  elapsed() { echo "[$(( SECONDS ))s] $*"; }
  rm -rf "$W" && mkdir -p "$R" "$OUT"
  trap keep EXIT
  "$PY" -c "from examples.models.tiny import build_tiny_model as b; b('$W/base', arch='qwen2', seed=5)"
  "$PY" -c "
import json; open('$W/data.jsonl', 'w').writelines(json.dumps({'prompt': f'{a}+1=', 'label': str(a + 1)}) + '\n'
                                                    for a in range(64))"
  # The GPU run's exact train flags (its sizes too), parsed here: a typo fails before any GPU minute.
  train_flags $W/base $W/data.jsonl
  "$PY" -c "import sys; from actors.loop.run_config import parse_run_config as p; p(sys.argv[1:]); print('GPU flags parse')" \
    "${TRAIN[@]}" "${ENGINE_GPU[@]}" || exit 2
  BATCH=2 SAMPLES=2 LEN=16
  train_flags $W/base $W/data.jsonl
  ENGINE=(--engine-type cpu --micro-batch-size 4)
  chaos_argv cpu
  "${CHAOS[@]}"
  elapsed "chaos exit $?"
  cat "$R/chaos.md" 2>/dev/null
  ;;
esac
