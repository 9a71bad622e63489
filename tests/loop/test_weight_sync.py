"""Ranks of the weight-update group: trainer rank 0, then every TP worker of every engine."""

import pytest

from actors.loop.weight_sync import WeightSyncError, broadcast_layout


def test_each_engine_takes_as_many_ranks_as_it_has_tp_workers():
    infos = [{"tp_size": 2}, {"tp_size": 1}, {"tp_size": 4}]
    assert broadcast_layout(["a", "b", "c"], infos) == ([1, 3, 4], 8)


def test_an_engine_that_does_not_report_its_tp_size_takes_one_rank():
    assert broadcast_layout(["cpu", "old"], [{"tp_size": 1}, {}]) == ([1, 2], 3)


@pytest.mark.parametrize("field", ["dp_size", "pp_size"])
def test_an_engine_with_dp_or_pp_is_refused_naming_it_and_the_way_out(field):
    with pytest.raises(WeightSyncError, match=rf"engine http://e1 runs with {field}=2: .*--update-weight-transport disk"):
        broadcast_layout(["http://e0", "http://e1"], [{"tp_size": 1}, {"tp_size": 1, field: 2}])
