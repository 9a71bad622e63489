"""benchmarks/gpu/moe_summary.py's table (benchmarks/gpu/moe.sh): run columns from metrics files and
each role's peak GPU memory per GPU from the sampler's rows, within each run's logging window."""

from __future__ import annotations

import json

from benchmarks.gpu.moe_summary import table


def test_columns_and_per_gpu_memory_peaks(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(row) for row in [
        {"time": 1000.0, "step": 0},  # the first row opens the window (120 s of start-up before it)
        {"time": 1010.0, "perf/step_time": 2.0, "train/logprob_abs_diff": 0.010},
        {"time": 1020.0, "perf/step_time": 4.0, "train/logprob_abs_diff": 0.030},
    ]))
    memory = tmp_path / "memory.csv"
    memory.write_text("\n".join([
        "1005.0,sglang@gpu0,11,1024", "1005.0,sglang@gpu0,12,512",  # one server's two processes: summed
        "1015.0,sglang@gpu0,11,2048", "1015.0,sglang@gpu0,12,0",
        "1005.0,trainer@gpu1,13,3072", "1005.0,total@gpu0,,1536", "1005.0,total@gpu1,,3072",
        "1005.0,python3@gpu1,14,9999",  # neither role: left out
        "2000.0,trainer@gpu1,13,99999",  # after the window (last row + 5 s): left out
    ]) + "\n")
    lines = table([f"a={tmp_path / 'a.jsonl'}", f"missing={tmp_path / 'none.jsonl'}"], memory).splitlines()
    rows = {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert lines[0] == "| | a | missing |"
    assert rows["steps trained"] == ["2", "0 |"]
    assert rows["step time, median s"] == ["3.00", "- |"]
    assert rows["|Δlogprob| train vs SGLang, mean"] == ["0.0200", "- |"]
    assert rows["GPU memory peak, sglang@gpu0 (nvidia-smi) GB"] == ["2.0", "- |"]  # max(1536, 2048) MiB
    assert rows["GPU memory peak, trainer@gpu1 (nvidia-smi) GB"] == ["3.0", "- |"]
    assert rows["GPU memory peak, total@gpu0 (nvidia-smi) GB"] == ["1.5", "- |"]
    assert not any("python3" in label for label in rows)
