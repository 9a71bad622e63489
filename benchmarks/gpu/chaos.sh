#!/usr/bin/env bash
# Issue #29 item 1: chaos against real SGLang, one fault per run (benchmarks/gpu/chaos.py: the
# faults, the table's columns, and the same logic against the CPU engine in
# tests/benchmarks/test_chaos_driver.py). On the device tool's nvidia-h200-x2 (or nvidia-h100-x2)
# host: the Megatron trainer on GPU 0, the runtime's own SGLang engine on GPU 1 (NCCL / disk
# weight updates); the CUDA IPC fault puts both on GPU 0 (--update-weight-transport tensor).
# Synchronous GRPO on the Qwen2.5-0.5B shape (random init, the tiny tokenizer's 512-token
# vocabulary; benchmarks/gpu/rl_sync_sglang.toml), 6 steps, the fault after step 2.
#
# Two calls, the second within the 30 s the host stays warm after the first:
#   stage  carry .gpu-wheels/b1                       (../shared/gpu/sglang-wheels.sh .gpu-wheels)
#   run    carry .gpu-wheels/b2 .gpu-wheels/b6        installs, writes model and data, runs FAULTS
# FAULTS defaults to every fault; split them over calls (each call has 10 minutes; a run starts its
# own SGLang, 1-3 minutes with its JIT, sigstop-engine 60 s more) with FAULTS=...: later calls on the
# warm host need no carry (the wheels stay installed) and append to the same table if OUT is kept,
# else merge the chaos.jsonl files. The trainer-rank fault saves a checkpoint every step.
# $OUT/chaos.md is the table, $OUT/chaos.jsonl its rows, $OUT/<fault>.log each run's log;
# copy them into benchmarks/gpu/results/chaos/ and the table into docs/reliability.md.
set -uo pipefail
source benchmarks/gpu/common.sh
W=/tmp/chaos
FAULTS=${FAULTS:-none,kill9-engine-generating,kill9-engine-disk-update,kill9-engine-paused-in-place,sigstop-engine,kill9-trainer-rank-update,kill9-engine-tensor-update}

case ${1:?phase: stage or run} in
stage)
  mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L
  ;;
run)
  install_sglang
  write_qwen05_shape $W/base 4096
  python3 examples/quickstart/make_task.py --out $W/data | tail -1
  elapsed "prepared"
  timeout $(( ${BUDGET_S:-570} - SECONDS )) python3 -m benchmarks.gpu.chaos --out "$OUT" --faults "$FAULTS" \
    --steps ${STEPS:-6} --fault-after 2 --stop-seconds ${STOP_S:-60} --timeout ${RUN_TIMEOUT_S:-300} -- \
    --config benchmarks/gpu/rl_sync_sglang.toml --hf-checkpoint $W/base --prompt-data $W/data/train.jsonl \
    --rollout-batch-size 32 --router-health-interval 1 --router-health-failures 2
  elapsed "chaos exit $?"
  cat "$OUT/chaos.md" 2>/dev/null
  ;;
esac
