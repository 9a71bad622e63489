#!/usr/bin/env bash
# Issue #29 item 2 on one GPU: the router's front under agent load in front of a real SGLang.
# benchmarks/front_load.py (its docstring: what is measured) runs N concurrent streamed,
# tool-calling Chat Completions sessions through `slime-async router`, which renders the chat
# template itself and sends token ids to SGLang's native /generate (--skip-tokenizer-init; SGLang's
# own template is never used). The model: a random-init Qwen2 with Qwen2.5-0.5B's layer shape
# (hidden 896, GQA 14/2, MLP 4864) and 8 layers, ~120 M parameters, the tiny tokenizer's 512-token
# vocabulary and its tools chat template (examples/models/tiny.py --chat-template tools), so every
# decode step is a real GPU forward. Random weights call no tools: every turn is a streamed answer
# of up to MAX_TOKENS random tokens (the requests still carry `tools` and the ReAct stop string).
# SGLang: --attention-backend triton --sampling-backend pytorch, --mem-fraction-static 0.3, no CUDA
# graphs (a shorter start), in its own session, killed at the end. CPUs (a 16-core host): SGLang
# 0-7, the router 8-9 (--router-cpus: cores of its own), the client 10-15.
#
# Calls (each within the ~30 s the host stays warm after the previous one):
#   b1    carry .gpu-wheels/b1                                   only if SGLang is not installed yet
#   run   carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b6     (no carry on a host where SGLang imports)
#         builds the model, starts SGLang, runs LOADS in order (default 100x2:openai 1000x3:aiohttp
#         1000x3:openai: SESSIONSxTURNS:CLIENT), each only with LOAD_MIN_S (75) left of BUDGET_S
#         (390: the call's ~420 s limit less the time to stop and keep), then stops SGLang. Expected:
#         ~60-90 s of SGLang start on a warm host (kernels compiled; ~165 s fresh), ~10 s for the
#         model, ~20 s for the small load, ~40-90 s per 1,000-session load. Device call timeout: 420.
#   cpu   the same chain on this machine (no GPU): a tiny model, `slime-async serve-engine` (the CPU
#         engine) started on a port as the external engine, LOADS_CPU (default 20x2:openai
#         100x2:aiohttp, 16 tokens); also prints the SGLang command line the run phase would launch.
#         PYTHON=/path/to/venv/bin/python bash benchmarks/gpu/front_load.sh cpu
# $OUT: front_load_table.md (the table, docs/agents.md's columns), front_load_<load>.json (raw rows),
# front_load_<load>.txt (each load's console), front_load_engine_tail.log, front_load_logs.tgz
# (the routers' logs).
set -uo pipefail
source benchmarks/gpu/common.sh
PY=${PYTHON:-python3}
W=${W:-/tmp/frontload}
BUDGET_S=${BUDGET_S:-390}
LOAD_MIN_S=${LOAD_MIN_S:-75}
MAX_TOKENS=${MAX_TOKENS:-128}
MODEL_ARGS=(--arch qwen2 --hidden-size 896 --num-layers 8 --num-attention-heads 14 --num-key-value-heads 2
            --intermediate-size 4864 --max-position-embeddings 4096)
ENGINE_PID=""
ROWS=()  # the loads' JSON rows, in the order they ran
FAILED_LOADS=""  # loads that exited non-zero (errors, a cut) or were skipped: the driver's exit is 1

# CPU sets on a host of 16 or more cores; on a smaller one only the router is pinned, to the last core.
split_cpus() {
  local n
  n=$(nproc)
  if [ "$n" -ge 16 ]; then
    SGLANG_CPUS=0-7 ROUTER_CPUS=8-9 CLIENT_CPUS=10-$(( n - 1 ))
  else
    SGLANG_CPUS="" ROUTER_CPUS=$(( n - 1 )) CLIENT_CPUS=""
  fi
  command -v taskset > /dev/null || { echo "no taskset: nothing pinned"; SGLANG_CPUS="" ROUTER_CPUS="" CLIENT_CPUS=""; }
}

build_model() {  # build_model DIR ARGS...: the model and its tools chat template, once per host
  local dir=$1
  shift
  [ -f "$dir/config.json" ] || "$PY" -m examples.models.tiny --out "$dir" --chat-template tools "$@" | tail -1 || exit 6
  elapsed "model $(du -sh "$dir" | cut -f1)"
}

# run_loads URL MODEL LOAD...: each LOAD is SESSIONSxTURNS:CLIENT, run while time is left
run_loads() {
  local url=$1 model=$2 load sessions turns client name left code
  shift 2
  mkdir -p "$W/tmp"
  for load in "$@"; do
    sessions=${load%%x*} turns=${load#*x} turns=${turns%%:*} client=${load##*:}
    name=${sessions}x${turns}_$client
    left=$(( BUDGET_S - SECONDS ))
    if [ "$left" -lt "$LOAD_MIN_S" ]; then
      elapsed "skipped $name: ${left} s left (LOAD_MIN_S=$LOAD_MIN_S)"
      FAILED_LOADS+=" $name(skipped)"
      continue
    fi
    # TMPDIR: front_load.py's work directory (router.log) lands where finish() collects it
    TMPDIR=$W/tmp timeout -k 10 $(( left - 10 )) ${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} "$PY" benchmarks/front_load.py \
      --engine-url "$url" --model-path "$model" --sessions "$sessions" --turns "$turns" --max-tokens "$MAX_TOKENS" \
      --client "$client" ${ROUTER_CPUS:+--router-cpus $ROUTER_CPUS} --json "$OUT/front_load_$name.json" \
      > "$OUT/front_load_$name.txt" 2>&1
    code=$?
    elapsed "$name exit $code"
    [ $code -eq 0 ] || FAILED_LOADS+=" $name(exit $code)"
    [ -f "$OUT/front_load_$name.json" ] && ROWS+=("$OUT/front_load_$name.json")
    tail -32 "$OUT/front_load_$name.txt"
  done
}

stop_engine() {  # its whole session: SIGTERM, then SIGKILL after 20 s
  local waited=0
  [ -n "$ENGINE_PID" ] || return 0
  kill -- -"$ENGINE_PID" 2>/dev/null
  while kill -0 -- -"$ENGINE_PID" 2>/dev/null && [ $waited -lt 20 ]; do sleep 1; waited=$(( waited + 1 )); done
  kill -9 -- -"$ENGINE_PID" 2>/dev/null
  wait "$ENGINE_PID" 2>/dev/null
  ENGINE_PID=""
}

finish() {  # stop the engine, keep its log tail, the routers' logs and the table
  stop_engine
  tail -60 "$W/engine.log" > "$OUT/front_load_engine_tail.log" 2>/dev/null
  tar czf "$OUT/front_load_logs.tgz" -C "$W" --exclude="torchinductor_*" tmp 2>/dev/null
  if [ ${#ROWS[@]} -gt 0 ]; then
    "$PY" benchmarks/front_load_table.py --engine-label "$ENGINE_LABEL" "${ROWS[@]}" > "$OUT/front_load_table.md"
    cat "$OUT/front_load_table.md"
  fi
  [ -z "$FAILED_LOADS" ] || echo "not measured in full:$FAILED_LOADS"
  elapsed "kept the results in $OUT"
}

case ${1:?phase: b1, run or cpu} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L ;;
run)
  if ! python3 -c "import sglang" 2>/dev/null; then
    install_sglang
    pipi .gpu-wheels/b3/*.whl
  fi
  # the aiohttp client's (the openai client's loads fail alone, in their .txt, if openai or httpx is missing)
  python3 -c "import aiohttp, orjson" || { echo "aiohttp or orjson does not import (see above)"; exit 3; }
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader  # another driver's server left running?
  rm -rf "$W/tmp" && mkdir -p "$W"
  split_cpus
  ENGINE_LABEL="SGLang $(python3 -c 'from importlib.metadata import version; print(version("sglang"))'), Qwen2 8x896 random, \
$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  trap finish EXIT
  build_model "$W/model" "${MODEL_ARGS[@]}"
  SGLANG_EXTRA=${SGLANG_EXTRA:-'{"disable_cuda_graph": true}'} launch_sglang "$W/model" "${PORT:-30300}" 0.3 "$W/engine.log"
  ENGINE_PID=$!
  status=$(wait_sglang "http://127.0.0.1:${PORT:-30300}" $(( BUDGET_S - LOAD_MIN_S - SECONDS )) "$ENGINE_PID")
  elapsed "$status"
  [[ $status == *" 200" ]] || { tail -40 "$W/engine.log"; exit 5; }
  run_loads "http://127.0.0.1:${PORT:-30300}" "$W/model" ${LOADS:-100x2:openai 1000x3:aiohttp 1000x3:openai}
  [ -z "$FAILED_LOADS" ] || exit 1
  ;;
cpu)  # the same chain against the CPU engine as an external one; W defaults to a fresh temporary directory
  export PYTHONPATH=$PWD
  W=${W_CPU:-$(mktemp -d)} OUT=${OUT_CPU:-$W/out}
  mkdir -p "$OUT" "$W"
  MAX_TOKENS=${MAX_TOKENS_CPU:-16} BUDGET_S=${BUDGET_S_CPU:-1200}
  split_cpus
  # the run phase's SGLang command line, built here: a bad flag fails before any GPU minute
  SGLANG_EXTRA=${SGLANG_EXTRA:-'{"disable_cuda_graph": true}'} sglang_argv "$W/gpu-model" 30300 0.3 || exit 2
  ENGINE_LABEL="CPU engine (serve-engine), tiny Qwen2"
  trap finish EXIT
  build_model "$W/model" --arch qwen2
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  setsid "$PY" -m actors.loop.cli serve-engine --model-path "$W/model" --port "$port" > "$W/engine.log" 2>&1 < /dev/null &
  ENGINE_PID=$!
  status=$(wait_sglang "http://127.0.0.1:$port" 180 "$ENGINE_PID")
  elapsed "$status"
  [[ $status == *" 200" ]] || { tail -40 "$W/engine.log"; exit 5; }
  run_loads "http://127.0.0.1:$port" "$W/model" ${LOADS_CPU:-20x2:openai 100x2:aiohttp}
  [ -z "$FAILED_LOADS" ] || exit 1
  ;;
*) echo "unknown phase $1: b1, run or cpu"; exit 2 ;;
esac
