"""benchmarks/gpu/chaos.py against the CPU engine: the logic the GPU run (benchmarks/gpu/chaos.sh)
uses, tested before any GPU minute is spent — a real run, a real kill -9 of its engine while a weight
update holds its requests paused in place, an external engine killed and restarted on its port, a run
cut at the invocation's deadline, and the table rows that say what happened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import orjson
import psutil

from benchmarks.gpu.chaos import Row, expected_prompts, latest, main, row_numbers, table, trained_prompts
from benchmarks.gpu.chaos_external import split_engine_flags
from examples.models.tiny import build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_expected_and_trained_prompts_count_losses_and_repeats(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "label": "x"}) + "\n" for p in ("a", "b", "c")))
    dump = tmp_path / "dump"
    dump.mkdir()
    group = lambda prompt: json.dumps([{"prompt": prompt}, {"prompt": prompt}])  # noqa: E731 - two samples
    # A response holding U+2028 and U+0085, raw in the dump as orjson writes them: still one line.
    raw = orjson.dumps([{"prompt": "a", "response": "x\u2028y\x85z"}]).decode()
    (dump / "step_000001.jsonl").write_text(raw + "\n" + group("a") + "\n")
    # A run stopped while it wrote step 2's dump left half a line: the whole lines count.
    (dump / "step_000002.jsonl").write_text(group("c") + "\n" + group("b")[:9])
    assert expected_prompts(data, 2) == ["a", "b"]
    assert trained_prompts(dump, 2) == ["a", "a", "c"]  # one entry per group
    assert row_numbers(["a", "b", "c"], {"c", "a"}) == "0, 2"
    assert row_numbers([str(i) for i in range(12)], {str(i) for i in range(12)}, most=3) == "0, 1, 2 and 9 more"


def test_the_table_shows_a_failures_last_line_only():
    rows = [Row("none", "completes", 0, 4, 0, 0, None, 1.5), Row("x", "fails", 1, 2, None, 0, None, 1.5,
                                                                 last_line="error: a | b")]
    lines = table(rows).splitlines()
    assert lines[2].endswith("| 1.5 |  |")
    assert lines[3].endswith("| error: a \\| b |")


@pytest.fixture
def tiny_run(tmp_path):
    """(model, data, the train flags of a short CPU run)."""
    model = build_tiny_model(tmp_path / "model", arch="qwen2", seed=5)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "label": str(a + 1)}) + "\n" for a in range(64)))
    return model, data, ["--hf-checkpoint", str(model), "--prompt-data", str(data), "--rollout-batch-size", "2",
                         "--n-samples-per-prompt", "2", "--rollout-max-response-len", "16", "--rm-type", "exact",
                         "--engine-type", "cpu", "--micro-batch-size", "4", "--router-health-interval", "0.5",
                         "--router-health-failures", "1"]


def test_the_external_engine_takes_the_owned_engines_sglang_flags_and_the_run_drops_the_rest():
    train, sglang = split_engine_flags(["--lr", "1e-5", "--engine-type", "sglang", "--rollout-share-trainer-gpus",
                                        "--sglang-mem-fraction-static", "0.35", "--sglang-disable-cuda-graph",
                                        "--engine-start-timeout=300", "--rm-type", "exact"])
    assert train == ["--lr", "1e-5", "--rm-type", "exact"]
    assert sglang == ["--mem-fraction-static", "0.35", "--disable-cuda-graph"]


def test_an_external_cpu_engine_restarted_on_its_port_completes_with_no_prompt_lost_or_repeated(tmp_path, tiny_run):
    _, _, flags = tiny_run
    out = tmp_path / "out"
    assert main(["--out", str(out), "--faults", "restart-external-engine", "--steps", "4", "--fault-after", "1",
                 "--timeout", "400", "--external-engine", "cpu", "--", *flags]) == 0
    row = json.loads((out / "chaos.jsonl").read_text())
    log = (out / "restart-external-engine.log").read_text()
    assert row["outcome"] == "completes", log[-3000:]
    assert (row["steps_trained"], row["prompts_lost"], row["prompts_repeated"]) == (4, 0, 0)
    # The driver polls for step 1's row and kills then: a fast step 2 may land first. What matters is that the
    # kill hit while the run still had steps to train.
    assert row["recover_s"] > 0 and 1 <= row["injected_at_step"] < 4
    assert "engines (external): http://127.0.0.1:" in log  # the driver's engine, not one the run started
    engine_log = (out / "restart-external-engine.engine.log").read_text()
    assert engine_log.count("--- start ") == 2  # started, killed, started again (on the same port)
    assert json.loads((out / "running.json").read_text()) == []  # every tree stopped


def test_a_run_still_going_at_the_deadline_is_cut_whole_and_its_row_says_so(tmp_path, tiny_run):
    _, _, flags = tiny_run
    out = tmp_path / "out"
    out.mkdir()
    (out / "chaos.jsonl").write_text(json.dumps({"fault": "sigstop-engine", "outcome": "completes"}) + "\n")
    # Processes of other tests' fixtures (a module's trainer, an engine) are not the driver's.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert main(["--out", str(out), "--faults", "none", "--steps", "3", "--deadline-s", "3", "--min-fault-s", "0",
                 "--", *flags]) == 0
    rows = [json.loads(line) for line in (out / "chaos.jsonl").read_text().splitlines()]
    assert [r["fault"] for r in rows] == ["sigstop-engine", "none"]
    assert rows[1]["outcome"] == "cut" and rows[1]["notes"][0].startswith("cut: --deadline-s reached"), rows[1]
    assert len((out / "chaos.md").read_text().splitlines()) == 2 + 2  # the earlier call's row is in the table too
    assert table(latest([Row("none", "cut"), Row("none", "completes")])).splitlines()[2].startswith("| none | completes")
    assert json.loads((out / "running.json").read_text()) == []
    assert not [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]


def test_a_fault_is_not_started_with_less_than_min_fault_s_left(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--faults", "none,sigstop-engine", "--deadline-s", "1", "--min-fault-s", "60",
                 "--", "--prompt-data", str(tmp_path / "prompts.jsonl")]) == 0
    assert "(--min-fault-s 60): FAULTS=none,sigstop-engine" in capsys.readouterr().out
    assert not (tmp_path / "runs").exists() and not (tmp_path / "chaos.jsonl").exists()


def test_skip_done_leaves_out_the_faults_in_the_table_and_runs_again_the_cut_ones(tmp_path, capsys):
    (tmp_path / "chaos.jsonl").write_text("".join(json.dumps(row) + "\n" for row in (
        {"fault": "none", "outcome": "completes"}, {"fault": "sigstop-engine", "outcome": "fails"},
        {"fault": "kill9-engine-generating", "outcome": "cut"})))
    assert main(["--out", str(tmp_path), "--faults", "none,kill9-engine-generating,sigstop-engine", "--skip-done",
                 "--deadline-s", "1", "--min-fault-s", "60", "--", "--prompt-data", str(tmp_path / "p.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "in the table already (--skip-done): none,sigstop-engine" in out
    assert "FAULTS=kill9-engine-generating" in out


# in_place: the engine dies with requests paused in it. tensor: it dies as the IPC handles go out (on CPU
# shared-memory files); SGLang on the GPU once failed the run here (its /server_info unreachable).
@pytest.mark.parametrize("fault", ["kill9-engine-paused-in-place", "kill9-engine-tensor-update"])
def test_kill_9_of_the_cpu_engine_during_a_sync_completes_with_no_prompt_lost_or_repeated(tmp_path, tiny_run, fault):
    _, _, flags = tiny_run
    out = tmp_path / "out"
    assert main(["--out", str(out), "--faults", fault, "--steps", "3", "--fault-after", "1",
                 "--timeout", "400", "--", *flags]) == 0
    row = json.loads((out / "chaos.jsonl").read_text())
    assert row["outcome"] == "completes", (out / f"{fault}.log").read_text()[-3000:]
    assert (row["steps_trained"], row["prompts_lost"], row["prompts_repeated"]) == (3, 0, 0)
    assert row["recover_s"] > 0 and row["injected_at_step"] == 1
    # The engine died inside sync v2's pause (held there until the driver saw it gone): its transfer failed.
    log = (out / f"{fault}.log").read_text()
    held = log.index("weight sync v2: held until")
    assert held < log.index("weight sync v2: released", held) < log.index("weight update failed on 1 engine(s)", held)
    assert (out / "chaos.md").read_text().splitlines()[2].startswith(f"| {fault} | completes | 3 |")


def test_a_fault_with_no_step_after_it_to_recover_by_is_refused_at_start(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--faults", "kill9-engine-paused-in-place", "--steps", "2", "--fault-after", "1",
              "--", "--prompt-data", str(tmp_path / "prompts.jsonl")])
    assert "--steps 2 leaves no step to train after kill9-engine-paused-in-place" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing was started
