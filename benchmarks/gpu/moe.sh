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
#
# Issue #30 on TWO GPUs (kind nvidia-h200-x2 or nvidia-h100-x2), the same model, STEPS steps per run:
#   b1    as above
#   run2  carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b6 .gpu-wheels/b7
#         installs and prepares as run, then expert parallelism against every expert on every rank on
#         one batch (torchrun over both GPUs, benchmarks/gpu/moe_ep.py: logprob and loss parity, train
#         tokens/s, peak memory per GPU: moe_ep.md), then the runs of RUNS2 in order while time is left
#   more2 (no carry) the runs of RUNS2 not finished yet; call again until the table has them all
#   cpu2  the two-GPU argument lists parsed, then the same chain on CPU at tiny sizes (2 gloo ranks)
# The layouts (RUNS2 = "tp2-r3 tp2-nor3 nccl-r3 nccl-nor3", fully-async, with and without R3):
#   tp2   the trainer's two ranks at EP2 and one SGLang engine at TP2 on both GPUs, resident side by
#         side, weights by CUDA IPC (TP worker k opens the handles of the trainer rank on GPU k). NCCL
#         cannot carry them here: an engine worker and a trainer rank on one GPU cannot be in one NCCL
#         group, and two GPUs leave no other place for a TP2 engine beside a trainer.
#   nccl  the trainer's one rank on GPU 0 (every expert on it), a TP1 SGLang engine on GPU 1, weights
#         over NCCL (--update-weight-transport distributed): the fallback when the TP2 engine
#         cannot take NCCL.
# $OUT: moe_ep.md, moe_2gpu_table.md, and per run the files above.
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
GPUS=${GPUS:-0}  # the runs' CUDA_VISIBLE_DEVICES (0,1 in the two-GPU phases)
RUNS2=${RUNS2:-tp2-r3 tp2-nor3 nccl-r3 nccl-nor3}
MIN_RUN_S=${MIN_RUN_S:-180}  # no run starts with less left in the call: SGLang's start, the steps
TP2=(--actor-num-gpus-per-node 2 --expert-model-parallel-size 2 --rollout-num-gpus 2 --rollout-num-gpus-per-engine 2)
NCCL=(--actor-num-gpus-per-node 1 --rollout-num-gpus 1 --update-weight-transport distributed)

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
  CUDA_VISIBLE_DEVICES=$GPUS timeout -s INT "$seconds" python3 -m actors.loop.cli train --config $CONFIG \
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
  [ $code -eq 0 ] && touch $W/$name.done
}

ep_parity() {  # ep_parity [FLAGS...]: EP1 vs EP2 on one batch over both GPUs (or 2 gloo ranks)
  CUDA_VISIBLE_DEVICES=$GPUS timeout ${EP_S:-240} python3 -m torch.distributed.run --nproc-per-node 2 \
    --master-port 29555 benchmarks/gpu/moe_ep.py --model-dir $W/model --layouts 1 2 "$@" > $W/ep.log 2>&1
  elapsed "ep parity exit $?"
  sed -n '/ ranks on /,$p' $W/ep.log | tee "$OUT/moe_ep.md"
  [ -s "$OUT/moe_ep.md" ] || { FAILED=$W/ep.log; grep -v -i warn $W/ep.log | tail -40 > "$OUT/moe_ep.md"; }
}

runs_left() {  # the runs of RUNS2 without a .done marker, in order, while MIN_RUN_S is left
  local name left flags
  for name in $RUNS2; do
    [ -f $W/$name.done ] && continue
    left=$(( ${RUN_UNTIL_S:-570} - SECONDS ))
    if [ $left -lt $MIN_RUN_S ]; then elapsed "no time left for $name ($left s): call more2"; return; fi
    case $name in
      tp2-*) flags=("${TP2[@]}") ;;
      nccl-*) flags=("${NCCL[@]}") ;;
      *) echo "unknown run $name (tp2-r3, tp2-nor3, nccl-r3, nccl-nor3)"; exit 2 ;;
    esac
    [ "${name##*-}" = nor3 ] && flags+=(--no-use-rollout-routing-replay)
    train $name $left "${flags[@]}"
  done
}

summary() {  # summary [RUN...] (default: r3 nor3) into $OUT/${TABLE:-moe_table.md}
  local runs=() names=("$@") name
  [ $# -gt 0 ] || names=(r3 nor3)
  for name in "${names[@]}"; do runs+=("$name=$W/$name/metrics.jsonl"); done
  cp $W/gpu_memory.csv "$OUT/moe_gpu_memory.csv" 2>/dev/null
  python3 benchmarks/gpu/moe_summary.py table --runs "${runs[@]}" \
    --memory $W/gpu_memory.csv | tee "$OUT/${TABLE:-moe_table.md}"
  if [ -n "$FAILED" ]; then
    echo "=== FAILED: $FAILED"
    awk '/^Traceback|^error: /{block=""} {block=block $0 "\n"} END{printf "%s", block}' "$FAILED" | tail -40
  fi
}

case ${1:?phase: b1, run, nor3, cpu, run2, more2 or cpu2} in
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
run2)  # two GPUs
  GPUS=0,1 TABLE=moe_2gpu_table.md
  install_sglang
  pipi .gpu-wheels/b3/*.whl .gpu-wheels/b7/*.whl
  mkdir -p $W
  sample_memory
  prepare
  ep_parity
  runs_left
  summary $RUNS2
  ;;
more2)
  GPUS=0,1 TABLE=moe_2gpu_table.md
  python3 -c "import sglang" || { echo "the host went cold: run the b1 and run2 phases again"; exit 4; }
  sample_memory
  runs_left
  cp "$W/ep.log" "$OUT/moe_ep.log" 2>/dev/null
  summary $RUNS2
  ;;
cpu2)  # the two-GPU chain at tiny sizes on CPU: 2 gloo ranks, the CPU engine (TP1), fp32
  W=${W_CPU:-$(mktemp -d)} OUT=${OUT_CPU:-$W/out} TABLE=moe_2gpu_table.md; mkdir -p "$OUT"
  export PYTHONPATH=$PWD
  MODEL_ARGS=(--arch qwen3_moe --num-layers 2 --num-experts 4 --head-dim 32)
  EXTRA=(--engine-type cpu --rollout-batch-size 4 --n-samples-per-prompt 2 --rollout-max-response-len 8
         --no-bf16 --max-tokens-per-gpu 512)
  STEPS=2 RUN_UNTIL_S=100000
  sample_memory() { :; }
  prepare
  # Both layouts' GPU argument lists parse first: a typo fails before any GPU minute (ranks on a CPU
  # host are --actor-num-procs: 2 stands for the two GPUs).
  for flags in "${TP2[*]}" "${NCCL[*]}"; do
    python3 -c "import sys; from actors.loop.run_config import parse_run_config as p; p(sys.argv[1:]); print('parses:', *sys.argv[7:-2])" \
      --config $CONFIG --hf-checkpoint $W/model --prompt-data $W/data/train.jsonl $flags --actor-num-procs 2 || exit 2
  done
  CONFIG=$W/cpu.toml; sed '/^\[sglang\]/,$d' examples/qwen3_moe/gpu.toml > $CONFIG
  TP2=(--actor-num-procs 2 --expert-model-parallel-size 2)  # the CPU engine has no TP: one engine
  NCCL=(--update-weight-transport distributed)              # gloo
  ep_parity --seq-len 32 --tokens-per-step 512 --max-tokens-per-gpu 128 --steps 1 --lr 0.05
  runs_left
  summary $RUNS2
  ;;
*) echo "unknown phase $1: b1, run, nor3, cpu, run2, more2 or cpu2"; exit 2 ;;
esac
