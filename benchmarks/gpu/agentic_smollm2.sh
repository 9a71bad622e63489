#!/usr/bin/env bash
# Issue #11's GPU runs: the code-interpreter and search agents (examples/agentic/) learning with
# the real SmolLM2-135M-Instruct on ONE H200 (the device tool's nvidia-h200). SGLang serves the
# bf16 model as an external engine on the GPU the one-rank Megatron trainer also uses (weights
# from disk); each agent gets a short supervised warm start on its traces (gpu_sft.toml), then
# fully-async GRPO + TIS (gpu.toml) with greedy held-out evaluation every 10 steps.
#
# The host has 16 cores, so the same calls also run, on cores the GPU side does not use:
#   - each agent's CPU learning run (its run.sh, tiny model) pinned to 2 cores with taskset, as on
#     the 2-core CI machine, and
#   - the staleness ablation (benchmarks/staleness_ablation.py) on the remaining cores.
# Those run in their own sessions (they outlive a call while the host stays warm) and are
# collected by the last phase.
#
# Inputs travel in batches over consecutive calls (each within the 30 s the host stays warm):
#   b1      carry .gpu-wheels/b1
#   b2      carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b4   (b4: bm25s)
#   gguf-a  carry .gpu-model/a
#   run     carry .gpu-model/b: installs, converts the model, writes the data, starts the CPU
#           runs and SGLang, warm-starts both agents on the GPU, trains code_interpreter
#   again   trains search against the SGLang server left warm
#   collect waits for the CPU runs (at most COLLECT_S) and returns their outputs
set -uo pipefail
source benchmarks/gpu/common.sh
export SLIME_ASYNC_CACHE=/tmp/cache
WORK=/tmp/agentic
URL=http://127.0.0.1:30000
GPU_CPUS=0-5              # SGLang, the trainer rank, the supervisor and the sandbox
CPU_RUNS="code_interpreter:6-7 search:8-9"   # example:cores, 2 each
ABLATION_CPUS=10-15       # 3 configurations at once, 2 cores each

gpu_train() {  # gpu_train NAME CONFIG SECONDS FLAGS...: a foreground run; SIGINT ends it at SECONDS
  local name=$1 config=$2 seconds=$3
  shift 3
  CUDA_VISIBLE_DEVICES=0 timeout -s INT "$seconds" taskset -c $GPU_CPUS python3 -m actors.loop.cli train \
    --config "$config" --run-dir $WORK/$name --no-progress-bar "$@" > $WORK/$name.log 2>&1
  elapsed "$name exit $?"
  cp "$WORK/$name/metrics.jsonl" "$OUT/agentic_${name}_metrics.jsonl" 2>/dev/null
  grep -v -i -E "warn" "$WORK/$name.log" | tail -400 > "$OUT/agentic_${name}_train.log" 2>/dev/null
}

progress() {  # progress NAME [METRIC ...]: the learning curve table of a GRPO run, with these columns too
  python3 benchmarks/gpu/learning_curve.py "$WORK/$1/metrics.jsonl" --columns ${@:2} \
    > "$OUT/agentic_$1_progress.txt" 2>&1
  tail -25 "$OUT/agentic_$1_progress.txt"
}

case ${1:?phase: b1, b2, gguf-a, run, again or collect} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L && nproc ;;
b2) mkdir -p /tmp/b2 && cp .gpu-wheels/b2/*.whl .gpu-wheels/b3/*.whl .gpu-wheels/b4/*.whl /tmp/b2/ && ls /tmp/b1 | wc -l ;;
gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
run)
  [ -d /tmp/b1 ] && [ -d /tmp/b2 ] && [ -d /tmp/gguf ] || { echo "a staged batch is missing: the host went cold"; exit 4; }
  pipi /tmp/b1/*.whl /tmp/b2/*.whl
  python3 -c "import sglang, megatron.core, bm25s; print('sglang', sglang.__version__)" || exit 3
  mkdir -p $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct $WORK
  cat /tmp/gguf/* .gpu-model/b/gguf.part* > $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct && echo "$(cut -d' ' -f1 $OLDPWD/.gpu-model/b/sha256)  SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c) || exit 5
  MODEL=$(python3 -c "from slime_async.pretrained import hf_checkpoint; print(hf_checkpoint(dtype='bfloat16'))" | tail -1)
  echo "$MODEL" > $WORK/model_path
  python3 examples/agentic/code_interpreter/make_task.py --out $WORK/ci-data --chat-tokenizer "$MODEL" || exit 6
  python3 examples/agentic/search/prepare.py --out $WORK/search-data --chat-tokenizer "$MODEL" || exit 6
  echo "turn_tokens: 48" >> $WORK/search-data/settings.yaml   # SmolLM2's tokens: a search call is ~20
  elapsed "prepared"
  # The CPU runs: each example's run.sh without its venv set-up (this host is offline; its
  # python3 has everything), with `python` and `slime-async` on PATH.
  mkdir -p .venv/bin && ln -sf "$(command -v python3)" .venv/bin/python
  printf '#!/bin/sh\nexec python3 -m actors.loop.cli "$@"\n' > .venv/bin/slime-async && chmod +x .venv/bin/slime-async
  for spec in $CPU_RUNS; do
    name=${spec%%:*} cores=${spec##*:}
    sed '/setup-venv/d' examples/agentic/$name/run.sh > examples/agentic/$name/.run_device.sh
    CUDA_VISIBLE_DEVICES="" setsid taskset -c $cores bash examples/agentic/$name/.run_device.sh > $WORK/cpu_$name.log 2>&1 < /dev/null &
  done
  CUDA_VISIBLE_DEVICES="" setsid taskset -c $ABLATION_CPUS python3 benchmarks/staleness_ablation.py \
    --out $WORK/ablation --parallel 3 ${ABLATION_FLAGS:-} > $WORK/ablation.log 2>&1 < /dev/null &
  SGLANG_CPUS=$GPU_CPUS launch_sglang "$MODEL" 30000 0.35 $WORK/sglang.log
  # The warm starts train on the GPU while SGLang compiles its kernels.
  gpu_train ci-sft examples/agentic/code_interpreter/gpu_sft.toml 150 --hf-checkpoint "$MODEL" \
    --prompt-data $WORK/ci-data/sft.jsonl --save-hf $WORK/ci-sft-hf
  gpu_train search-sft examples/agentic/search/gpu_sft.toml 150 --hf-checkpoint "$MODEL" \
    --prompt-data $WORK/search-data/sft.jsonl --save-hf $WORK/search-sft-hf
  elapsed "$(wait_sglang $URL 300)"
  gpu_train ci examples/agentic/code_interpreter/gpu.toml $(( ${RUN_UNTIL_S:-560} - SECONDS )) \
    --hf-checkpoint $WORK/ci-sft-hf --prompt-data $WORK/ci-data/train.jsonl \
    --eval-prompt-data $WORK/ci-data/heldout.jsonl --rollout-external-engine-addrs $URL
  progress ci rollout/tool_calls rollout/tool_errors rollout/turns
  ;;
again)
  python3 -c "import urllib.request as u; print('SGLang', u.urlopen('$URL/health_generate', timeout=20).status)" || exit 7
  gpu_train search examples/agentic/search/gpu.toml "${AGAIN_S:-540}" \
    --hf-checkpoint $WORK/search-sft-hf --prompt-data $WORK/search-data/train.jsonl \
    --eval-prompt-data $WORK/search-data/heldout.jsonl --custom-config-path $WORK/search-data/settings.yaml \
    --rollout-external-engine-addrs $URL
  progress search rollout/searches rollout/turns
  ;;
collect)
  deadline=$(( SECONDS + ${COLLECT_S:-420} ))
  while pgrep -f "run_device.sh|staleness_ablation.py" > /dev/null && [ $SECONDS -lt $deadline ]; do sleep 5; done
  pgrep -af "run_device.sh|staleness_ablation.py" | head -5
  for spec in $CPU_RUNS; do
    name=${spec%%:*}
    tail -40 $WORK/cpu_$name.log
    grep -v -i warn $WORK/cpu_$name.log | tail -300 > "$OUT/agentic_cpu_${name}.log"
  done
  find runs -name metrics.jsonl -path "*grpo*" | tar czf "$OUT/agentic_cpu_metrics.tgz" -T - 2>/dev/null
  tail -60 $WORK/ablation.log
  cp $WORK/ablation.log "$OUT/staleness_ablation.log"
  (cd $WORK/ablation && tar czf "$OUT/staleness_ablation.tgz" results.json table.md $(find runs -name metrics.jsonl) 2>/dev/null)
  ;;
esac
