"""--save-debug-rollout-data: a dump reads back as it was written."""

from __future__ import annotations

from actors.loop.debug_dump import dump_groups, load_groups, read_groups
from slime_async.sample import Sample


def test_a_response_holding_unicode_line_separators_reads_back_as_one_group(tmp_path):
    # U+2028 and U+0085 (a random model's byte-level output holds them now and then): orjson writes
    # them raw, and str.splitlines would cut the line there.
    odd = Sample(group_index=0, index=0, prompt="1+1=", tokens=[5, 6, 7], response_length=2, response="x\u2028y\x85z",
                 loss_mask=[1, 1], rollout_logprobs=[-0.5, -0.25])
    plain = Sample(group_index=1, index=0, prompt="2+2=", tokens=[5, 8], response_length=1, response="4",
                   loss_mask=[1], rollout_logprobs=[-1.0])
    path = dump_groups(tmp_path, 3, [[odd], [plain]])
    assert path.name == "step_000003.jsonl"
    assert [[s["response"] for s in group] for group in read_groups(path)] == [["x\u2028y\x85z"], ["4"]]
    assert list(load_groups(tmp_path)) == [(3, [[odd], [plain]])]
