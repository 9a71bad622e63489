# Shared by the device-host drivers in benchmarks/gpu/ (source it from the repository root):
# the offline install of carried wheels, an SGLang server left running across calls, and the
# environment every NCCL process there needs.
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# NVLink multicast off (KINDS.md); NCCL weight updates hang with cuMem allocations on either side.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_CUMEM_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"

elapsed() { echo "[$(( SECONDS ))s] $*"; }
# stage_wheels DIR BATCH...: copy whichever of .gpu-wheels/BATCH this call carries into DIR and mark
# each: batches that pass, with the working tree, the 64 MiB a call carries are staged over several
# calls of one phase (b2 alone, then b3 b5 b6). staged DIR BATCH... exits 4 naming a batch not there.
stage_wheels() {
  local dir=$1 b
  shift
  mkdir -p "$dir"
  for b in "$@"; do [ -d .gpu-wheels/$b ] && cp .gpu-wheels/$b/*.whl "$dir/" && touch "$dir/.have-$b"; done
  echo "staged in $dir: $(ls -A "$dir" | sed -n 's/^\.have-//p' | tr '\n' ' ')"
}
staged() {
  local dir=$1 b
  shift
  for b in "$@"; do
    [ -e "$dir/.have-$b" ] || { echo "staged batch $b is missing (not carried, or the host went cold)"; exit 4; }
  done
}
# Carried wheels into /tmp/site: no index (the host is offline), no dependency resolution.
pipi() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$@" 2>&1 | grep -v -i warning | tail -3; }

# launch_sglang MODEL_DIR PORT MEM_FRACTION LOG: start SGLang in its own session (it outlives the
# call that starts it, until the host goes back) with the backends this host's build needs;
# SGLANG_CPUS (a taskset list) keeps it off cores other work is pinned to; SGLANG_EXTRA (a JSON
# object of server-argument fields, e.g. '{"disable_cuda_graph": true}') adds flags.
launch_sglang() {
  local argv
  argv=$(sglang_argv "$1" "$2" "$3") || return 2
  elapsed "launch: $argv"
  CUDA_VISIBLE_DEVICES=${SGLANG_GPU:-0} setsid ${SGLANG_CPUS:+taskset -c $SGLANG_CPUS} bash -c "exec $argv" > "$4" 2>&1 < /dev/null &
}

# sglang_argv MODEL_DIR PORT MEM_FRACTION: launch_sglang's command line, printed (a CPU host checks it).
sglang_argv() {
  ${PY:-python3} -c "import json, shlex, sys; from actors.engine.sglang import build_sglang_argv as b; print(shlex.join(b(
sys.argv[1], port=int(sys.argv[2]), python='python3', passthrough={'attention_backend': 'triton',
'sampling_backend': 'pytorch', 'mem_fraction_static': float(sys.argv[3]), 'log_level': 'warning',
**({'cuda_graph_max_bs_decode': int(sys.argv[4])} if sys.argv[4] else {}), **json.loads(sys.argv[5] or '{}')})))" \
    "$1" "$2" "$3" "${CUDA_GRAPH_MAX_BS:-}" "${SGLANG_EXTRA:-}"
}

# wait_sglang URL [SECONDS [PID]]: until /health_generate answers 200 (the first launch JIT-compiles
# kernels for about 3 minutes), or process PID (the server's) has exited; prints the last status.
wait_sglang() {
  python3 - "$1" "${2:-360}" "${3:-}" <<'PY'
import sys, time, urllib.request
url, deadline, pid = sys.argv[1], time.time() + float(sys.argv[2]), sys.argv[3]


def exited() -> bool:  # gone, or a zombie its parent shell has not reaped yet
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


status = "no answer"
while time.time() < deadline:
    if pid and exited():
        status = "exited"
        break
    try:
        with urllib.request.urlopen(url + "/health_generate", timeout=60) as r:
            status = r.status
            if status == 200:
                break
    except Exception as error:
        status = type(error).__name__
        time.sleep(2)
print("SGLang", url, status)
PY
}

# install_sglang: the wheels an earlier call staged in /tmp/b1 plus .gpu-wheels/b2 and b6 carried by
# this one (../shared/gpu/sglang-wheels.sh), unless a call before did; exits 4 when the host went cold in between, 3 when
# SGLang does not import.
install_sglang() {
  python3 -c "import sglang" 2>/dev/null && { echo "sglang already installed"; return 0; }  # a warm host's
  [ -d /tmp/b1 ] || { echo "b1 is missing: the host went cold between the calls"; exit 4; }
  pipi /tmp/b1/*.whl .gpu-wheels/b2/*.whl .gpu-wheels/b6/*.whl
  python3 -c "import sglang; print('sglang', sglang.__version__)" || exit 3
}

# write_qwen05_shape DIR MAX_POSITIONS: Qwen2.5-0.5B's shape (24 layers, hidden 896, GQA 14/2),
# random init, with the tiny tokenizer's 512-token vocabulary.
write_qwen05_shape() {
  python3 -c "from examples.models.tiny import build_tiny_model as b; b('$1', vocab_size=512, \
hidden_size=896, num_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, \
max_position_embeddings=$2, tie_word_embeddings=True)" 2>&1 | tail -1
}
