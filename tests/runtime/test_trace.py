"""slime_async.trace.TraceRecorder: the --trace-dir timeline's recorder, on a scripted clock."""

import json

import pytest

from slime_async.trace import TraceRecorder


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def spans(path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


def test_spans_past_the_cap_are_dropped_and_counted(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", max_events=3, clock=clock)
    lane = trace.lane("trainer", "ranks")
    for i in range(5):
        trace.record(f"op {i}", lane, clock.t, clock.t + 1.0)
    trace.close()
    data = json.loads((tmp_path / "trace.json").read_text())
    assert [e["name"] for e in data["traceEvents"] if e["ph"] == "X"] == ["op 0", "op 1", "op 2"]
    assert data["otherData"]["dropped_events"] == 2
    assert data["otherData"]["max_events"] == 3


def test_a_span_is_microseconds_since_the_recorder_started_on_a_named_lane(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", clock=clock)
    clock.t = 101.5
    trace.record("train_step", trace.lane("trainer", "ranks"), 101.5, 103.75, cat="train", samples=4)
    trace.close()
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    [span] = [e for e in events if e["ph"] == "X"]
    assert (span["ts"], span["dur"], span["args"]) == (1_500_000.0, 2_250_000.0, {"samples": 4})
    names = {(e["name"], e["pid"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert names[("process_name", span["pid"], 0)] == {"name": "trainer"}
    assert names[("thread_name", span["pid"], span["tid"])] == {"name": "ranks"}


def test_overlapping_spans_of_a_pool_take_separate_lanes_and_reuse_free_ones(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", clock=clock)
    pool = trace.pool("engine a", "request")
    # Recorded as they end: [0,1] and [0.5,2] overlap; [1,3] fits after [0,1] on its lane.
    for start, end in ((0.0, 1.0), (0.5, 2.0), (1.0, 3.0)):
        trace.record("generate", pool, 100 + start, 100 + end)
    trace.close()
    tids = [e["tid"] for e in spans(tmp_path / "trace.json")]
    assert tids[0] != tids[1] and tids[2] == tids[0]


def test_a_block_that_raises_is_recorded_with_the_error(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", clock=clock)
    with pytest.raises(KeyError):
        with trace.span("pause", trace.lane("weight sync", "sync"), mode="abort"):
            clock.t += 0.25
            raise KeyError("engine")
    trace.close()
    [span] = spans(tmp_path / "trace.json")
    assert span["args"] == {"mode": "abort", "error": "KeyError"} and span["dur"] == 250_000.0


def test_the_file_is_rewritten_while_the_run_goes_on_and_leaves_no_temporary(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", flush_interval=10.0, clock=clock)
    lane = trace.lane("buffer", "trainer waits for data")
    trace.record("wait for data", lane, 100.0, 101.0)
    assert not (tmp_path / "trace.json").exists()  # within the interval: nothing written yet
    clock.t = 111.0
    trace.record("wait for data", lane, 110.0, 111.0)  # a crash from here on still leaves both spans
    assert len(spans(tmp_path / "trace.json")) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json"]


def test_short_waits_are_left_out(tmp_path):
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", clock=clock)
    lane = trace.lane("buffer", "rollout waits for room")
    trace.record("wait for admission", lane, 100.0, 100.0005, min_seconds=0.001)
    trace.record("wait for admission", lane, 100.0, 100.5, min_seconds=0.001)
    trace.close()
    assert len(spans(tmp_path / "trace.json")) == 1


def test_a_recorder_without_a_path_writes_nothing(tmp_path):
    trace = TraceRecorder.off()
    with trace.span("generate", trace.pool("engine a")):
        pass
    trace.close()
    assert not trace.enabled and list(tmp_path.iterdir()) == []


def test_args_may_take_any_name_but_the_options(tmp_path):
    # A hook's trace_args reach record() as keywords: "name" or "start" must not clash.
    clock = Clock()
    trace = TraceRecorder(tmp_path / "trace.json", clock=clock)
    trace.record("generate", trace.lane("engine a", "request"), 100.0, 101.0, name="tool", start=3)
    trace.close()
    [span] = spans(tmp_path / "trace.json")
    assert span["name"] == "generate" and span["args"] == {"name": "tool", "start": 3}


def test_an_unwritable_trace_path_mid_run_warns_once_recording_goes_on_and_close_raises(tmp_path, caplog):
    clock = Clock()
    blocker = tmp_path / "gone"
    trace = TraceRecorder(blocker / "trace.json", flush_interval=1.0, clock=clock)
    lane = trace.lane("buffer", "trainer waits for data")
    blocker.write_text("a file where the trace directory should be")  # every write now raises OSError
    for step in range(3):
        clock.t += 2.0
        trace.record("wait for data", lane, clock.t - 1.0, clock.t)
    assert trace.write_errors == 3 and len(trace._events) == 3
    assert [r.levelname for r in caplog.records if "cannot write" in r.message] == ["WARNING"]
    with pytest.raises(OSError):
        trace.close()
    from actors.loop.launch import _close_trace  # the CLI's import cost only here

    _close_trace(trace)  # the run's end reports it in one line and keeps its exit code
    assert [r.levelname for r in caplog.records if "could not be written" in r.message] == ["ERROR"]
    blocker.unlink()  # the disk is back: the final file holds every span
    trace.close()
    assert len(spans(blocker / "trace.json")) == 3
