"""The console's last line after a failed rank: the headline, the exception and where it was raised."""

from __future__ import annotations

import io

from slime_async.runtime import report_error

RANK_FAILURE = """TrainerOpError: trainer rank 0: save failed:
Traceback (most recent call last):
  File "/work/actors/megatron/rank.py", line 230, in save
    save_checkpoint(path, unwrap_model(self.ddp), self.optimizer, self.scheduler, {"step": self.step})
  File "/site/megatron/core/dist_checkpointing/optimizer.py", line 145, in optim_state_to_sharding_state
    raise ValueError(f'Param id {param_id} does not match any model sharded param')
ValueError: Param id 121 does not match any model sharded param
"""


def last_line(message: str) -> str:
    out = io.StringIO()
    report_error(message, file=out)
    return out.getvalue().rstrip("\n").splitlines()[-1]


def test_a_rank_traceback_ends_with_its_exception_file_and_line():
    assert last_line(RANK_FAILURE) == (
        "error: TrainerOpError: trainer rank 0: save failed: ValueError: Param id 121 does not match any model "
        "sharded param (at /site/megatron/core/dist_checkpointing/optimizer.py:145)")


def test_a_log_tail_without_a_traceback_ends_with_its_first_line_and_one_line_is_printed_once():
    assert last_line("engine died\nlast log line") == "error: engine died"
    out = io.StringIO()
    report_error("bad flag --x", file=out)
    assert out.getvalue() == "error: bad flag --x\n"
