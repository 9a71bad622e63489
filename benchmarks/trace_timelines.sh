#!/usr/bin/env bash
# The CPU timelines in benchmarks/results/ (trace_sync.png, trace_fully_async.png and their
# trace JSON): the quick start's model and task (random init, no warm start), 8 GRPO steps of
# 16 prompts x 8 samples on one CPU engine, in sync and in fully-async mode (staleness 2),
# each with --trace-dir, drawn by benchmarks/render_trace.py. A few minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
out=${OUT:-runs/trace_timelines}
rm -rf "$out"
python -m examples.models.tiny --out "$out/base" --arch qwen2 --seed 0
python examples/quickstart/make_task.py --out "$out/data"
for mode in sync fully-async; do
  staleness=$([ "$mode" = sync ] && echo "" || echo "--max-staleness 2")
  # shellcheck disable=SC2086
  slime-async train --config benchmarks/trace_timelines.toml --train-mode "$mode" $staleness \
    --run-dir "$out/$mode" --hf-checkpoint "$out/base" --prompt-data "$out/data/train.jsonl" \
    --trace-dir "$out/$mode/trace" --no-progress-bar
  name=trace_${mode//-/_}
  cp "$out/$mode/trace/trace.json" "benchmarks/results/$name.json"
  python benchmarks/render_trace.py "benchmarks/results/$name.json" -o "benchmarks/results/$name.png"
done
