#!/usr/bin/env bash
# Issue #16's GPU runs: --colocate (trainer and SGLang time-share the GPUs, CUDA-IPC weight
# updates through update_weights_from_tensor).
#
# The host is offline and takes at most 64 MiB per call, so the inputs travel in batches over
# consecutive calls (each within the 30 s the host stays warm), as smollm2_grpo.sh does:
#   b1          carry .gpu-wheels/b1                       (../shared/gpu/sglang-wheels.sh .gpu-wheels)
#   b2          carry .gpu-wheels/b2, then b2 again carrying .gpu-wheels/b3 .gpu-wheels/b4 .gpu-wheels/b5
#               .gpu-wheels/b6 (two calls: all five and the tree pass the 64 MiB a call carries; b3: math-verify,
#               aiorwlock; b4: bm25s, the search agent's; b5: torch_memory_saver
#               0.0.10, which SGLang's --enable-memory-saver needs; b6: zstandard 0.25.0 for cp312,
#               setup.cfg's pin for the delta codec: without it the runtime fails at start)
#   one-gpu     (nvidia-h200) 8 sync GRPO steps colocated on GPU 0, Qwen2.5-0.5B shape (rl_colocate.toml);
#               alone in its call: SGLang takes ~2 min 45 s to start on a fresh host
#   gguf-a      carry .gpu-model/a                         (SmolLM2-135M-Instruct's .gguf, first part)
#   smollm2     carry .gpu-model/b: the same run on SmolLM2-135M-Instruct's real weights (bf16)
#   two-gpu     (nvidia-h200-x2, after b1 and b2 there) TP=2 SGLang engine + TP=2 trainer colocated on
#               GPUs 0-1
#   disagg      (nvidia-h200-x2) the same workload disaggregated: trainer GPU 0, SGLang GPU 1, NCCL
#               updates (rl_sync_sglang.toml) - the step time to compare with
# Each run prints per step: |Δlogprob| train vs inference (train/logprob_abs_diff: in sync mode the
# exactness of the update), each side's peak memory, offload / onload / weight-update seconds and
# the step time. Each run's files come back as $OUT/NAME.tgz; unpack them into benchmarks/gpu/results/.
set -uo pipefail
source benchmarks/gpu/common.sh
export SLIME_ASYNC_CACHE=/tmp/cache

prepare_shape() {  # the Qwen2.5-0.5B-shaped random model and the task data of rl_sync_sglang.toml
  python3 -c "from examples.models.tiny import build_tiny_model as b; b('/tmp/rl/base', vocab_size=512, \
hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, \
max_position_embeddings=4096, tie_word_embeddings=True)" 2>&1 | tail -1
  python3 examples/quickstart/make_task.py --out /tmp/rl/data | tail -1
}

install() {  # once per host (agent_smollm2.sh run installs the same batches)
  python3 -c "import sglang, megatron.core, torch_memory_saver" 2>/dev/null && return
  [ -d /tmp/b1 ] || { echo "staged batch b1 is missing (not carried, or the host went cold)"; exit 4; }
  staged /tmp/b2 b2 b3 b4 b5 b6
  pipi /tmp/b1/*.whl /tmp/b2/*.whl
  python3 -c "import sglang, megatron.core, torch_memory_saver; print('sglang', sglang.__version__)" || exit 3
}

run() {  # run($1 = name, $2 = seconds, flags...): one training run in the foreground, then its table
  local name=$1 seconds=$2; shift 2
  local D=/tmp/rl/results/$name  # packed into $OUT/$name.tgz at the end ($OUT takes 8 files a call)
  mkdir -p $D
  # Each process's device memory every second (trainer rank vs SGLang): the peak of each side.
  nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv,noheader -lms 1000 \
    > "$D/${name}_gpu_memory.csv" 2>/dev/null &
  local smi=$!
  timeout -s INT "$seconds" python3 -m actors.loop.cli train --run-dir /tmp/rl/$name "$@" > "$D/$name.log" 2>&1
  elapsed "$name exit $?"
  kill $smi 2>/dev/null
  python3 - "$D/${name}_gpu_memory.csv" <<'PY' | tee "$D/${name}_gpu_memory_peaks.txt"
import collections, sys
peak = collections.defaultdict(int)
for line in open(sys.argv[1]):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 4 and parts[3].endswith("MiB"):
        peak[(parts[1], parts[2])] = max(peak[(parts[1], parts[2])], int(parts[3].split()[0]))
for (pid, name), mib in sorted(peak.items()):
    print(f"peak device memory: pid {pid} {name}: {mib} MiB")
PY
  cp /tmp/rl/$name/metrics.jsonl "$D/${name}_metrics.jsonl" 2>/dev/null
  grep -h "memory:\|weights:" /tmp/rl/$name/logs/engine-0.log > "$D/${name}_engine_phases.log" 2>/dev/null
  python3 - "$D/${name}_metrics.jsonl" <<'PY' | tee "$D/$name.txt"
import json, sys
keys = ["train/logprob_abs_diff", "memory/trainer_peak_gb", "memory/engine_serving_weight_gb",
        "memory/engine_serving_kvcache_gb", "memory/engine_released_weight_gb", "memory/engine_released_kvcache_gb",
        "perf/release_memory_time", "perf/onload_time", "perf/offload_time", "perf/weight_update_time",
        "perf/colocate_sync_time", "perf/train_time", "perf/step_time", "rollout/reward_mean"]
print("| step | " + " | ".join(k.split("/")[1] for k in keys) + " |")
for line in open(sys.argv[1]):
    row = json.loads(line)
    if "train/step" in row:
        print(f"| {row['step']} | " + " | ".join(f"{row.get(k, float('nan')):.4g}" for k in keys) + " |")
PY
  grep -v -i -E "warn" "$D/$name.log" | grep -E "colocate: |Error|error:" | tail -30
  cp -r /tmp/rl/$name/logs $D/ 2>/dev/null
  tar czf "$OUT/$name.tgz" -C /tmp/rl/results $name
}

case ${1:?phase: b1, b2, one-gpu, gguf-a, smollm2, two-gpu or disagg} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L ;;
b2) stage_wheels /tmp/b2 b2 b3 b4 b5 b6 ;;
gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
one-gpu)
  install && prepare_shape
  run colocate_1gpu_qwen0.5b $(( ${RUN_UNTIL_S:-560} - SECONDS )) --config benchmarks/gpu/rl_colocate.toml
  ;;
smollm2)
  install
  [ -d /tmp/gguf ] || { echo "gguf-a is missing: the host went cold"; exit 4; }
  mkdir -p $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct /tmp/rl/data
  [ -f $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf ] ||
    cat /tmp/gguf/* .gpu-model/b/gguf.part* > $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  (cd $SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct && echo "$(cut -d' ' -f1 $OLDPWD/.gpu-model/b/sha256)  SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c) || exit 5
  python3 examples/smollm2_math/prepare.py --out /tmp/smollm2 --dtype bfloat16 || exit 6
  run colocate_1gpu_smollm2 $(( ${RUN_UNTIL_S:-560} - SECONDS )) --config benchmarks/gpu/rl_colocate.toml \
    --hf-checkpoint /tmp/smollm2/model --prompt-data /tmp/smollm2/data/train.jsonl --rm-type math \
    --apply-chat-template --rollout-max-response-len 256 --rollout-temperature 0.7 --bf16 --lr 5e-6
  ;;
two-gpu)
  install && prepare_shape
  run colocate_2gpu_tp2 $(( ${RUN_UNTIL_S:-560} - SECONDS )) --config benchmarks/gpu/rl_colocate.toml \
    --actor-num-gpus-per-node 2 --tensor-model-parallel-size 2 --rollout-num-gpus 2 --rollout-num-gpus-per-engine 2
  ;;
disagg)
  install && prepare_shape
  run disagg_2gpu $(( ${RUN_UNTIL_S:-560} - SECONDS )) --config benchmarks/gpu/rl_sync_sglang.toml
  ;;
esac
