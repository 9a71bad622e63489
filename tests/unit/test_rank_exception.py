"""A dead rank's own exception ends the TrainerRankDied message, not torchrun's summary (the
reader is slime_async/exception_text.py's, shared with engines: tests/unit/test_exception_text.py)."""

from pathlib import Path

from actors.trainer.torchrun import TrainerRankDied
from slime_async.exception_text import log_exception

# What torchrun's log holds when rank 0 raises (shape of torch 2.x's elastic agent output).
LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/x/actors/trainer/worker.py", line 37, in <module>
[rank0]:     main()
[rank0]:   File "/x/actors/megatron/worker.py", line 90, in serve
[rank0]:     self.build()
[rank0]:   File "/x/actors/megatron/bridge.py", line 120, in build_gpt_model
[rank0]:     raise ValueError("num_attention_heads 7 does not divide hidden_size 64")
[rank0]: ValueError: num_attention_heads 7 does not divide hidden_size 64
E1202 21:00:00 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 357, in wrapper
    return f(*args, **kwargs)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
actors.trainer.worker FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_the_rank_traceback_not_torchruns_is_picked_and_cut_to_its_innermost_frames():
    assert log_exception(LOG, frames=2) == (
        "Traceback (most recent call last):\n"
        '  File "/x/actors/megatron/worker.py", line 90, in serve\n'
        "    self.build()\n"
        '  File "/x/actors/megatron/bridge.py", line 120, in build_gpt_model\n'
        '    raise ValueError("num_attention_heads 7 does not divide hidden_size 64")\n'
        "ValueError: num_attention_heads 7 does not divide hidden_size 64")


def test_no_rank_traceback_gives_nothing():
    assert log_exception("torchrun: signal 9\n" + LOG.split("E1202", 1)[1]) == ""


def test_the_message_ends_with_the_log_exception():
    death = TrainerRankDied(0, 123, Path("/run/trainer.log"), LOG, "torchrun exited with code 1")
    lines = str(death).splitlines()
    assert lines[-1] == "ValueError: num_attention_heads 7 does not divide hidden_size 64"
    assert lines[-2].strip() == 'raise ValueError("num_attention_heads 7 does not divide hidden_size 64")'
    assert "bridge.py" in lines[-3]
    assert "trainer rank 0 (pid 123)'s exception:" in lines


def test_a_real_torchrun_rank_with_a_long_chained_traceback_ends_with_its_exception_and_cause(tmp_path):
    """@record (as actors/megatron/worker.py's ``run``): torchrun's summary ends with the rank's whole
    traceback, so one of 150+ lines is found however long it is, with its chain's root cause."""
    import subprocess
    import sys

    script = tmp_path / "boom.py"
    script.write_text(
        "from torch.distributed.elastic.multiprocessing.errors import record\n"
        "def build(depth):\n"
        "    if depth:\n"
        "        return build(depth - 1)\n"
        "    try:\n"
        "        {}['hidden_size']\n"
        "    except KeyError as error:\n"
        "        raise ValueError('bad hidden_size 7') from error\n"
        "@record\n"
        "def main():\n"
        "    build(150)\n"
        "main()\n")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)],
                         capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode != 0 and "ChildFailedError" in log  # torchrun's summary is in the log...
    death = TrainerRankDied(0, 1, tmp_path / "log", log[-2000:], log_text=log)
    lines = str(death).splitlines()
    assert lines[-1] == "ValueError: bad hidden_size 7"  # ...but the rank's exception ends the message
    assert lines[-2].strip() == "raise ValueError('bad hidden_size 7') from error"
    assert lines[-3] == f'  File "{script}", line 8, in build'
    cause = lines.index("KeyError: 'hidden_size'")  # the chain's root cause, with its frame
    assert lines[cause - 3] == f'  File "{script}", line 6, in build'
    assert "The above exception was the direct cause of the following exception:" in lines[cause:]
    assert len(death.child_exception.splitlines()) < 25  # innermost frames only, not 150 recursive calls
