# Shared by the SmolLM2 drivers on the device host (agent_smollm2.sh, opd_smollm2.sh; source it
# after common.sh, from the repository root): the carried inputs, staged one batch per call (each
# call takes at most 64 MiB), installed, and the GGUF reassembled; the failed run's error report.

# stage_batch PHASE: b1, b2 or gguf-a, each a call of its own that copies its carried batch to /tmp
# (kept while the host stays warm, 30 s after a call); b2 is two calls (b2 alone, then b3 b5 b6:
# common.sh's stage_wheels), and the install checks that all four arrived.
stage_batch() {
  case $1 in
  b1) mkdir -p /tmp/b1 && cp .gpu-wheels/b1/*.whl /tmp/b1/ && nvidia-smi -L && nproc ;;
  b2) stage_wheels /tmp/b2 b2 b3 b5 b6 ;;
  gguf-a) mkdir -p /tmp/gguf && cp .gpu-model/a/* /tmp/gguf/ && ls -la /tmp/gguf ;;
  *) echo "stage_batch: unknown batch $1"; return 2 ;;
  esac
}

# install_smollm2: in the call that carries .gpu-model/b, the staged wheels (unless a call before
# installed them) and SmolLM2's GGUF in $SLIME_ASYNC_CACHE, checked against its sha256. Exits 4
# when a staged batch is gone (the host went cold in between), 3 when SGLang does not import,
# 5 on a checksum mismatch.
install_smollm2() {
  python3 -c "import sglang, megatron.core" 2>/dev/null || {
    [ -d /tmp/b1 ] || { echo "staged batch b1 is missing (not carried, or the host went cold)"; exit 4; }
    staged /tmp/b2 b2 b3 b5 b6
    pipi /tmp/b1/*.whl /tmp/b2/*.whl; }
  python3 -c "import sglang, megatron.core; print('sglang', sglang.__version__)" || exit 3
  local gguf=$SLIME_ASYNC_CACHE/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$gguf" ]; then
    [ -d /tmp/gguf ] || { echo "gguf-a is missing: the host went cold"; exit 4; }
    mkdir -p "$(dirname "$gguf")" && cat /tmp/gguf/* .gpu-model/b/gguf.part* > "$gguf"
  fi
  (cd "$(dirname "$gguf")" && echo "$(cut -d' ' -f1 "$OLDPWD/.gpu-model/b/sha256")  $(basename "$gguf")" | sha256sum -c) \
    || exit 5
}

# show_failure: the failed run's ($FAILED, a log) last traceback and the CLI's closing `error:`
# line, last on the console; 1 when there was one.
show_failure() {
  [ -n "${FAILED:-}" ] || return 0
  echo "=== FAILED: $FAILED"
  awk '/^Traceback|^error: /{block=""} {block=block $0 "\n"} END{printf "%s", block}' "$FAILED" | tail -40
  grep -E "^error: " "$FAILED" | tail -1
  return 1
}
