#!/usr/bin/env bash
# Issue #11's GPU runs: the code-interpreter and search agents (examples/agentic/) learning with
# the real SmolLM2-135M-Instruct on ONE H200 (the device tool's nvidia-h200). Each agent gets its
# own SGLang server (bf16, an external engine) on the GPU its one-rank Megatron trainer also uses
# (weights from disk), a short supervised warm start on its traces (gpu_sft.toml), then
# fully-async GRPO + TIS (gpu.toml) with greedy held-out evaluation every 10 steps. The two agents
# train side by side (a 135M model leaves the GPU mostly idle), on separate cores.
#
# Inputs travel in batches over consecutive calls (each within the 30 s the host stays warm):
#   b1      carry .gpu-wheels/b1
#   b2      carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b4 .gpu-wheels/b5 .gpu-wheels/b6 (b4: bm25s; b5:
#           torch_memory_saver, for colocate.sh on the same host; b6: zstandard, setup.cfg's pin)
#   gguf-a  carry .gpu-model/a
#   run     carry .gpu-model/b: installs (unless colocate.sh did), converts the model, writes the
#           data, starts both SGLang servers, warm-starts and trains both agents until RUN_UNTIL_S
# Training runs stay in the foreground of the call: a run left in the background of one call was
# killed when that call returned (smollm2_grpo.sh).
set -uo pipefail
source benchmarks/gpu/common.sh
export SLIME_ASYNC_CACHE=/tmp/cache
WORK=/tmp/agentic

gpu_train() {  # gpu_train NAME CORES CONFIG SECONDS FLAGS...: one run; SIGINT ends it at SECONDS
  local name=$1 cores=$2 config=$3 seconds=$4
  shift 4
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "$seconds" taskset -c "$cores" python3 -m actors.loop.cli train \
    --config "$config" --run-dir $WORK/$name --no-progress-bar "$@" > $WORK/$name.log 2>&1
  elapsed "$name exit $?"
  mkdir -p $WORK/results
  cp "$WORK/$name/metrics.jsonl" "$WORK/results/agentic_${name}_metrics.jsonl" 2>/dev/null
  grep -v -i -E "warn" "$WORK/$name.log" | tail -300 > "$WORK/results/agentic_${name}_train.log" 2>/dev/null
}

# agent NAME CORES PORT DATA SFT_FLAGS GRPO_FLAGS: warm start, then GRPO against its SGLang server
agent() {
  local name=$1 cores=$2 url=http://127.0.0.1:$3 data=$4 dir=examples/agentic/$1
  gpu_train $name-sft "$cores" $dir/gpu_sft.toml 200 --hf-checkpoint "$MODEL" \
    --prompt-data $data/sft.jsonl --save-hf $WORK/$name-sft-hf
  elapsed "$name: $(wait_sglang $url 300)"
  gpu_train $name "$cores" $dir/gpu.toml $(( ${RUN_UNTIL_S:-570} - SECONDS )) --hf-checkpoint $WORK/$name-sft-hf \
    --prompt-data $data/train.jsonl --eval-prompt-data $data/heldout.jsonl --rollout-external-engine-addrs $url "${@:5}"
  python3 benchmarks/gpu/learning_curve.py $WORK/$name/metrics.jsonl --columns $AGENT_COLUMNS \
    > "$WORK/results/agentic_${name}_progress.txt" 2>&1
  tail -60 $WORK/sglang-$name.log > "$WORK/results/agentic_${name}_sglang_tail.log"
  (cd $WORK/results && tar czf "$OUT/agentic_$name.tgz" agentic_$name*)  # $OUT takes 8 files a call
}

case ${1:?phase: b1, b2, gguf-a or run} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L && nproc ;;
b2) mkdir -p /tmp/b2 && cp .gpu-wheels/b{2,3,4,5,6}/*.whl /tmp/b2/ && ls /tmp/b1 | wc -l ;;
gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
run)
  python3 -c "import sglang, megatron.core, bm25s" 2>/dev/null || {
    [ -d /tmp/b1 ] && [ -d /tmp/b2 ] || { echo "a staged batch is missing: the host went cold"; exit 4; }
    pipi /tmp/b1/*.whl /tmp/b2/*.whl; }
  python3 -c "import sglang, megatron.core, bm25s; print('sglang', sglang.__version__)" || exit 3
  GGUF=$SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f $GGUF ]; then
    [ -d /tmp/gguf ] || { echo "gguf-a is missing: the host went cold"; exit 4; }
    mkdir -p $(dirname $GGUF) && cat /tmp/gguf/* .gpu-model/b/gguf.part* > $GGUF
  fi
  (cd $(dirname $GGUF) && echo "$(cut -d' ' -f1 $OLDPWD/.gpu-model/b/sha256)  $(basename $GGUF)" | sha256sum -c) || exit 5
  MODEL=$(python3 -c "from examples.models.pretrained import hf_checkpoint; print(hf_checkpoint(dtype='bfloat16'))" | tail -1)
  mkdir -p $WORK
  python3 examples/agentic/code_interpreter/make_task.py --out $WORK/ci-data --chat-tokenizer "$MODEL" | tail -2 || exit 6
  python3 examples/agentic/search/prepare.py --out $WORK/search-data --chat-tokenizer "$MODEL" | tail -2 || exit 6
  echo "turn_tokens: 48" >> $WORK/search-data/settings.yaml   # SmolLM2's tokens: a search call is ~20
  elapsed "prepared $MODEL"
  SGLANG_CPUS=0-3 launch_sglang "$MODEL" 30000 0.3 $WORK/sglang-code_interpreter.log
  SGLANG_CPUS=8-11 launch_sglang "$MODEL" 30001 0.3 $WORK/sglang-search.log
  AGENT_COLUMNS="rollout/tool_calls rollout/tool_errors rollout/turns" \
    agent code_interpreter 0-7 30000 $WORK/ci-data &
  AGENT_COLUMNS="rollout/searches rollout/turns" \
    agent search 8-15 30001 $WORK/search-data --custom-config-path $WORK/search-data/settings.yaml &
  wait
  for name in code_interpreter search; do
    echo "== $name"; grep -E "^\| |held-out" "$WORK/results/agentic_${name}_progress.txt" | tail -14
    grep -E "Error|error:" $WORK/$name-sft.log $WORK/$name.log | grep -v -i warn | tail -5
  done
  ;;
esac
