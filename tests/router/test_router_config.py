"""RouterConfig validation: a bad value fails at start and names its flag."""

import pytest

from actors.router import RouterConfig


def test_the_defaults_are_valid_and_sticky():
    config = RouterConfig()
    config.validate()
    assert config.router_policy == "sticky"


def test_a_bad_config_value_names_its_flag():
    with pytest.raises(ValueError, match="--router-health-failures"):
        RouterConfig(router_health_failures=0).validate()
    with pytest.raises(ValueError, match="--router-imbalance-threshold"):
        RouterConfig(router_imbalance_threshold=-1).validate()
    with pytest.raises(ValueError, match="--router-policy"):
        RouterConfig(router_policy="random").validate()  # type: ignore[arg-type]
