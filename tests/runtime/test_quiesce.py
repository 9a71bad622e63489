"""The quiesce vocabulary: one set of names from --weight-update-mode to the engine's request."""

import logging

import pytest

from actors.loop.config import TrainConfig
from slime_async.quiesce import QUIESCE_MODES, check_mode, engine_pause_mode, leaves_engine_idle


def test_the_modes_are_abort_drain_in_place_and_retract():
    assert QUIESCE_MODES == ("abort", "drain", "in_place", "retract")


@pytest.mark.parametrize(("mode", "engine_mode", "idle"), [
    ("abort", None, True),        # the router aborts its own requests and resubmits them
    ("drain", None, True),        # nothing is sent to the engine: its requests finish
    ("in_place", "in_place", False),
    ("retract", "retract", False),
])
def test_each_mode_maps_to_one_engine_pause_request_and_says_whether_the_engine_ends_idle(mode, engine_mode, idle):
    assert engine_pause_mode(mode) == engine_mode
    assert leaves_engine_idle(mode) is idle


def test_an_unknown_mode_is_one_line_naming_where_it_came_from():
    with pytest.raises(ValueError, match=r"^router\.pause: 'flush' is not one of abort, drain, in_place, retract$"):
        check_mode("flush", "router.pause")


def test_the_old_name_pause_is_accepted_as_drain_with_one_warning(caplog):
    config = TrainConfig(weight_update_mode="pause")
    with caplog.at_level(logging.WARNING):
        config.validate()
    assert config.weight_update_mode == "drain"
    assert [r.getMessage() for r in caplog.records] == ["--weight-update-mode pause is now called drain"]
