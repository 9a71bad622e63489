#!/usr/bin/env bash
# What SGLang 0.5.17 does with the prompt-logprob requests and the token ids we send it: the
# prompt-logprob contract (tests/contract/test_engine_prompt_logprobs.py, the OPD teacher scorer
# included) against a real server on a tiny Qwen2, then benchmarks/gpu/probe_sglang_input.py's
# raw answers (its last request, an out-of-vocabulary id, kills the server: that is the point).
# Calls: b1 (carry .gpu-wheels/b1), run (carry .gpu-wheels/b2 .gpu-wheels/b3 .gpu-wheels/b6 .gpu-wheels/b7:
# SGLang, then pytest-asyncio and the test's other packages), within 30 s.
# TESTS picks the contract files (default the prompt-logprob one; e.g.
# TESTS="tests/contract/test_engine_preconditions.py tests/contract/test_engine_prompt_logprobs.py": the
# control sequences around a weight update that the runtime sends, against the server); PROBE=0 skips the probe.
# $OUT: contract.txt, probe.txt, sglang.log.
set -uo pipefail
source benchmarks/gpu/common.sh
case ${1:?phase: b1 or run} in
b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L ;;
run)
  install_sglang
  pipi .gpu-wheels/b3/*.whl .gpu-wheels/b7/*.whl
  python3 -m examples.models.tiny --out /tmp/tinyd | tail -1
  launch_sglang /tmp/tinyd 30200 0.2 "$OUT/sglang.log"
  elapsed "$(wait_sglang http://127.0.0.1:30200 400 $!)"
  SLIME_ASYNC_TEST_ENGINE_URL=http://127.0.0.1:30200 SLIME_ASYNC_TEST_ENGINE_MODEL=/tmp/tinyd \
    SLIME_ASYNC_TEST_LOGPROB_ATOL=${ATOL:-0.002} SLIME_ASYNC_TEST_WEIGHT_BACKEND=gloo timeout ${CONTRACT_S:-200} \
    python3 -m pytest -v -p no:cacheprovider ${TESTS:-tests/contract/test_engine_prompt_logprobs.py} 2>&1 | tail -80 \
    > "$OUT/contract.txt"
  grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/contract.txt" | tail -40
  echo "health after the contract: $(curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:30200/health_generate)" \
    | tee -a "$OUT/contract.txt"
  [ "${PROBE:-1}" = 1 ] || exit 0
  vocab=$(python3 -c "import json; print(json.load(open('/tmp/tinyd/config.json'))['vocab_size'])")
  timeout 100 python3 benchmarks/gpu/probe_sglang_input.py http://127.0.0.1:30200 "$vocab" | tee "$OUT/probe.txt"
  sleep 3
  echo "health after the probe: $(curl -s -m 5 -o /dev/null -w '%{http_code}' http://127.0.0.1:30200/health_generate)" \
    | tee -a "$OUT/probe.txt"
  grep -v Indexing.cu "$OUT/sglang.log" > "$OUT/sglang_trimmed.log"; mv "$OUT/sglang_trimmed.log" "$OUT/sglang.log"
  ;;
*) echo "unknown phase $1: b1 or run"; exit 2 ;;
esac
