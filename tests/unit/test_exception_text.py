"""The exception a failure is about: from an SGLang server's or a CPU engine's log, and from a
live exception (a hook's); and the console's last lines (runtime.report_error)."""

import io
from pathlib import Path

from slime_async.exception_text import child_exception, describe, log_exception, log_window
from slime_async.process import ProcessExited
from slime_async.runtime import report_error
from slime_async.supervisor import SupervisorGaveUp

SITE = "/venv/lib/python3.12/site-packages/sglang/srt"
# SGLang 0.5.x's logging: "[%(asctime)s{prefix}] %(message)s" with prefix " TP0" in a scheduler
# process; a scheduler that raises logs "Scheduler hit an exception: " + the formatted traceback,
# then SIGQUITs the launcher, whose handler logs "Received sigquit ..." and kills the tree.
SGLANG_MID_RUN = f"""\
[2026-12-02 10:00:01] INFO:     127.0.0.1:50412 - "POST /generate HTTP/1.1" 200 OK
[2026-12-02 10:00:02 TP0] Decode batch, #running-req: 3, #token: 412, token usage: 0.00, #queue-req: 0,
[2026-12-02 10:00:02 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "{SITE}/managers/scheduler.py", line 2712, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/usr/lib/python3.12/contextlib.py", line 81, in inner
    return func(*args, **kwds)
           ^^^^^^^^^^^^^^^^^^^
  File "{SITE}/managers/scheduler.py", line 1021, in event_loop_overlap
    self.process_input_requests(recv_reqs)
  File "{SITE}/managers/scheduler_update_weights_mixin.py", line 48, in update_weights_from_disk
    success, message = self._flush_cache_for_update()
  File "{SITE}/managers/scheduler.py", line 2301, in flush_cache
    assert self.is_fully_idle(), "flush_cache needs an idle scheduler"
           ^^^^^^^^^^^^^^^^^^^^
AssertionError: flush_cache needs an idle scheduler

[2026-12-02 10:00:02] Received sigquit from a child process. It usually means the child failed.
Killed
"""

# At start: the scheduler dies building its model runner, then the launcher, reading the pipe the
# dead scheduler left, raises its own EOFError: the scheduler's exception is the one to show.
SGLANG_AT_START = f"""\
=== 2026-12-02 09:00:00 start: python -m sglang.launch_server --model-path /old
[2026-12-02 09:00:05 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "{SITE}/old.py", line 1, in old
ValueError: an earlier start's failure
=== 2026-12-02 09:59:00 start: python -m sglang.launch_server --model-path /models/qwen
[2026-12-02 09:59:20 TP0] Load weight begin. avail mem=78.50 GB
[2026-12-02 09:59:21 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "{SITE}/model_executor/model_runner.py", line 612, in load_model
    self.model = get_model(model_config=self.model_config, load_config=self.load_config)
  File "{SITE}/model_loader/loader.py", line 377, in load_weights_and_postprocess
    model.load_weights(weights)
  File "{SITE}/models/qwen2.py", line 540, in load_weights
    param = params_dict[name]
            ~~~~~~~~~~~^^^^^^
KeyError: 'model.layers.0.mlp.gate_up_proj.weight'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "{SITE}/managers/scheduler.py", line 2702, in run_scheduler_process
    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)
  File "{SITE}/model_executor/model_runner.py", line 615, in load_model
    raise RuntimeError(f"Failed to load weights from {{self.model_config.model_path}}") from e
RuntimeError: Failed to load weights from /models/qwen

[2026-12-02 09:59:21] Rank 0 scheduler is dead. Please check if there are relevant logs.
[2026-12-02 09:59:22] Exit code: -9
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "{SITE}/../launch_server.py", line 11, in <module>
    launch_server(server_args)
  File "{SITE}/entrypoints/engine.py", line 851, in _launch_subprocesses
    data = scheduler_pipe_readers[i].recv()
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
EOFError
"""


def test_an_sglang_scheduler_assertion_mid_run_is_the_exception_not_the_sigquit():
    assert log_exception(SGLANG_MID_RUN, frames=2) == (
        "Traceback (most recent call last):\n"
        f'  File "{SITE}/managers/scheduler_update_weights_mixin.py", line 48, in update_weights_from_disk\n'
        "    success, message = self._flush_cache_for_update()\n"
        f'  File "{SITE}/managers/scheduler.py", line 2301, in flush_cache\n'
        '    assert self.is_fully_idle(), "flush_cache needs an idle scheduler"\n'
        "           ^^^^^^^^^^^^^^^^^^^^\n"
        "AssertionError: flush_cache needs an idle scheduler")


def test_at_start_the_schedulers_chained_exception_beats_the_launchers_eoferror_and_older_starts(tmp_path):
    log = tmp_path / "engine-0.log"
    log.write_text(SGLANG_AT_START)
    text = log_exception(log_window(log), frames=1)
    lines = text.splitlines()
    assert lines[-1] == "RuntimeError: Failed to load weights from /models/qwen"
    assert lines[-3] == f'  File "{SITE}/model_executor/model_runner.py", line 615, in load_model'
    # the chain's root cause first, with its innermost frame
    assert lines[:5] == ["Traceback (most recent call last):",
                         f'  File "{SITE}/models/qwen2.py", line 540, in load_weights',
                         "    param = params_dict[name]", "            ~~~~~~~~~~~^^^^^^",
                         "KeyError: 'model.layers.0.mlp.gate_up_proj.weight'"]
    assert "The above exception was the direct cause of the following exception:" in lines
    assert "EOFError" not in text and "earlier start" not in text


def test_the_launchers_own_failure_is_shown_when_no_scheduler_reported_one():
    log = f"""\
Traceback (most recent call last):
  File "{SITE}/server_args.py", line 900, in __post_init__
    self.check_server_args()
  File "{SITE}/server_args.py", line 1702, in check_server_args
    assert self.tp_size % self.nnodes == 0, "tp_size must be divisible by number of nodes"
AssertionError: tp_size must be divisible by number of nodes
"""
    assert log_exception(log).splitlines()[-1] == "AssertionError: tp_size must be divisible by number of nodes"


def test_when_every_innermost_frame_is_a_librarys_the_innermost_own_frame_is_kept():
    log = """\
Traceback (most recent call last):
  File "/work/actors/engine/cpu/server.py", line 427, in serve
    runner = ModelRunner(path)
  File "/work/actors/engine/cpu/model_runner.py", line 86, in __init__
    self.model = AutoModelForCausalLM.from_pretrained(path)
  File "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4327, in from_pretrained
    loading_info = cls._load_pretrained_model(model)
  File "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4445, in _load_pretrained_model
    file_pointer = safe_open(file, framework="pt", device="cpu")
safetensors._safetensors_rust.SafetensorError: Error while deserializing header: header too large
"""
    assert log_exception(log, frames=1).splitlines() == [
        "Traceback (most recent call last):",
        '  File "/work/actors/engine/cpu/model_runner.py", line 86, in __init__',
        "    self.model = AutoModelForCausalLM.from_pretrained(path)",
        "  ...",
        '  File "/venv/lib/python3.11/site-packages/transformers/modeling_utils.py", line 4445, in '
        "_load_pretrained_model",
        '    file_pointer = safe_open(file, framework="pt", device="cpu")',
        "safetensors._safetensors_rust.SafetensorError: Error while deserializing header: header too large"]


def test_a_log_without_a_traceback_gives_nothing():
    assert log_exception("[2026-12-02 10:00:00] server started\nKilled\n") == ""


def _raise_from(message: str) -> BaseException:
    try:
        try:
            {}["key"]
        except KeyError as error:
            raise ValueError(message) from error
    except ValueError as error:
        return error


def test_describe_names_type_message_own_frame_and_the_root_cause():
    text = describe(_raise_from("bad sample"))
    assert text.startswith(f"ValueError: bad sample (at {__file__}:")
    assert "in _raise_from); caused by KeyError: 'key' (at " in text


def test_the_console_ends_with_the_summary_line_and_then_the_childs_exception():
    exception = log_exception(SGLANG_MID_RUN)
    exited = ProcessExited("engine-0", -9, Path("/run/logs/engine-0.log"), "…tail…", exception)
    gave_up = SupervisorGaveUp("engines", "engine-0", exited, 3, 60)
    out = io.StringIO()
    report_error(str(gave_up), file=out, exception=child_exception(gave_up))
    lines = out.getvalue().splitlines()
    assert lines[-1] == "AssertionError: flush_cache needs an idle scheduler"
    section = lines.index("engine-0's exception:")
    assert lines[section - 1].startswith("error: supervisor 'engines' gave up: child 'engine-0'")
    assert lines[section + 1:] == exception.splitlines()
    assert out.getvalue().count("flush_cache needs an idle scheduler\n") == 1  # not twice
