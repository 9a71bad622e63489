#!/usr/bin/env bash
# Issue #27 item 4 on one GPU: a random-init Qwen3-MoE of Qwen3-30B-A3B's layer shape (4 layers,
# 128 experts of width 768, top-8; 2.5 B parameters) trains fully-async with the runtime's SGLang
# engine beside the one-rank Megatron trainer (examples/qwen3_moe/gpu.toml: both resident, weights by
# CUDA IPC), once with rollout routing replay (R3) and once without, each from the same checkpoint.
# Measured per run: rollout tokens/s, step time, train-inference |Δlogprob|, the fraction of (token,
# MoE layer) pairs the trainer routes differently from SGLang (R3 run: it replays, and counts), and
# each side's peak GPU memory (nvidia-smi, sampled every second, per process). Before the runs,
# SGLang's routed experts are checked against transformers' routers on a tiny Qwen3-MoE
# (tests/contract/test_engine_routed_experts.py against a real SGLang server).
#
# Calls (each within the 30 s the host stays warm after the previous one):
#   b1    carry .gpu-wheels/b1
#   run   carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b6 .gpu-wheels/b7
#         installs, builds the model (fp32 safetensors, ~10 GB) and the data, the R3 run (STEPS steps or
#         until RUN_UNTIL_S, default 570 s into the call: SIGINT ends it cleanly)
#   nor3  (no carry) the run without R3, then the routed-experts contract check if time is left
#   cpu   the same chain on CPU at tiny sizes (the CPU engine, fp32): checks every flag before GPU time
# $OUT: moe_table.md (side by side), moe_<run>_metrics.jsonl, moe_<run>_train.log, moe_<run>_progress.txt,
# moe_gpu_memory.csv, moe_contract.txt.
set -uo pipefail
source benchmarks/gpu/common.sh
W=${W:-/tmp/moe}
STEPS=${STEPS:-12}
CONFIG=examples/qwen3_moe/gpu.toml
MODEL_ARGS=(--arch qwen3_moe --hidden-size 2048 --num-layers "${LAYERS:-4}" --num-attention-heads 32
            --num-key-value-heads 4 --head-dim 128 --intermediate-size 1536 --num-experts 128
            --num-experts-per-tok 8 --max-position-embeddings 4096)
EXTRA=()  # the cpu phase's overrides
FAILED=""

sample_memory() {  # per-process GPU memory every second, until the call ends (kept on the host across calls)
  python3 benchmarks/gpu/moe_summary.py sample $W/gpu_memory.csv &
}

prepare() {  # the model and the task data, once per host
  [ -f $W/model/config.json ] || python3 -m examples.models.tiny --out $W/model "${MODEL_ARGS[@]}" | tail -1 || exit 6
  [ -f $W/data/train.jsonl ] || python3 examples/quickstart/make_task.py --out $W/data | tail -1
  elapsed "prepared $(du -sh $W/model | cut -f1)"
}

contract() {  # SGLang's routed experts vs transformers' routers, tiny Qwen3-MoE, its own server
  python3 -m examples.models.tiny --out $W/tiny --arch qwen3_moe --num-experts 4 | tail -1
  launch_sglang_routed $W/tiny 30100 0.1 $W/contract_sglang.log
  local server=$!
  elapsed "$(wait_sglang http://127.0.0.1:30100 $(( ${RUN_UNTIL_S:-570} - 40 - SECONDS )))"
  SLIME_ASYNC_TEST_ENGINE_URL=http://127.0.0.1:30100 SLIME_ASYNC_TEST_ENGINE_MODEL=$W/tiny timeout 120 \
    python3 -m pytest -q -p no:cacheprovider tests/contract/test_engine_routed_experts.py 2>&1 | tail -15 \
    | tee "$OUT/moe_contract.txt"
  kill -- -$server 2>/dev/null  # its session: the server and its scheduler processes
  tail -30 $W/contract_sglang.log >> "$OUT/moe_contract.txt"
}

launch_sglang_routed() {  # launch_sglang with --enable-return-routed-experts (the contract server)
  local argv
  argv=$(python3 -c "import shlex, sys; from actors.engine.sglang import build_sglang_argv as b; print(shlex.join(b(
sys.argv[1], port=int(sys.argv[2]), python='python3', passthrough={'attention_backend': 'triton',
'sampling_backend': 'pytorch', 'mem_fraction_static': float(sys.argv[3]), 'log_level': 'warning',
'enable_return_routed_experts': True})))" "$1" "$2" "$3")
  CUDA_VISIBLE_DEVICES=0 setsid bash -c "exec $argv" > "$4" 2>&1 < /dev/null &
}

train() {  # train NAME SECONDS FLAGS...: one run in the foreground; SIGINT ends it at SECONDS
  local name=$1 seconds=$2 code
  shift 2
  rm -rf $W/$name
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "$seconds" python3 -m actors.loop.cli train --config $CONFIG \
    --run-dir $W/$name --hf-checkpoint $W/model --prompt-data $W/data/train.jsonl --num-rollout $STEPS \
    --no-progress-bar "${EXTRA[@]}" "$@" > $W/$name.log 2>&1
  code=$?
  elapsed "$name exit $code"
  cp "$W/$name/metrics.jsonl" "$OUT/moe_${name}_metrics.jsonl" 2>/dev/null
  grep -v -i -E "warn" "$W/$name.log" | tail -200 > "$OUT/moe_${name}_train.log"
  tail -60 $W/$name/logs/engine*.log > "$OUT/moe_${name}_sglang_tail.log" 2>/dev/null
  python3 benchmarks/gpu/learning_curve.py "$W/$name/metrics.jsonl" --columns train/moe/routing_mismatch \
    perf/rollout_tokens_per_s train/moe/load_imbalance > "$OUT/moe_${name}_progress.txt" 2>&1
  if [ $code -ne 0 ] && [ $code -ne 124 ] && [ $code -ne 130 ]; then FAILED=$W/$name.log; fi
}

summary() {
  cp $W/gpu_memory.csv "$OUT/moe_gpu_memory.csv" 2>/dev/null
  python3 benchmarks/gpu/moe_summary.py table --runs r3=$W/r3/metrics.jsonl nor3=$W/nor3/metrics.jsonl \
    --memory $W/gpu_memory.csv | tee "$OUT/moe_table.md"
  if [ -n "$FAILED" ]; then
    echo "=== FAILED: $FAILED"
    awk '/^Traceback|^error: /{block=""} {block=block $0 "\n"} END{printf "%s", block}' "$FAILED" | tail -40
  fi
}

case ${1:?phase: b1, run, nor3 or cpu} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L ;;
run)
  install_sglang
  pipi .gpu-wheels/b3/*.whl .gpu-wheels/b7/*.whl
  mkdir -p $W
  sample_memory
  prepare
  train r3 $(( ${RUN_UNTIL_S:-570} - SECONDS ))
  summary
  ;;
nor3)
  python3 -c "import sglang" || { echo "the host went cold: run the b1 and run phases again"; exit 4; }
  sample_memory
  train nor3 $(( ${RUN_UNTIL_S:-570} - ${CONTRACT_S:-200} - SECONDS )) --no-use-rollout-routing-replay
  [ $(( ${RUN_UNTIL_S:-570} - SECONDS )) -gt 120 ] && contract
  summary
  ;;
cpu)  # the chain at tiny sizes on CPU (fp32 CPU engine); W defaults to a fresh temporary directory
  W=${W_CPU:-$(mktemp -d)} OUT=${OUT_CPU:-$W/out}; mkdir -p "$OUT"
  MODEL_ARGS=(--arch qwen3_moe --num-layers 2 --num-experts 4 --head-dim 32)
  EXTRA=(--engine-type cpu --rollout-batch-size 4 --n-samples-per-prompt 2 --rollout-max-response-len 8
         --no-bf16 --max-tokens-per-gpu 512)
  STEPS=2
  # the config without its [sglang] section (its flags apply only to SGLang engines)
  CONFIG=$W/cpu.toml; sed '/^\[sglang\]/,$d' examples/qwen3_moe/gpu.toml > $CONFIG
  sample_memory() { :; }
  prepare
  train r3 600
  train nor3 600 --no-use-rollout-routing-replay
  summary
  ;;
*) echo "unknown phase $1: b1, run, nor3 or cpu"; exit 2 ;;
esac
