"""RunConfig.resolve: every value one section derives from another, computed once at parse time,
so the actors receive finished sections (actors/loop/run_config.py)."""

import pytest

from actors.loop.run_config import parse_run_config
from actors.rollout.config import RolloutConfig
from slime_async.config.flags import ConfigError
from slime_async.config.loader import config_to_dict, dump_config

REQUIRED = ["--prompt-data", "p.jsonl", "--hf-checkpoint", "model/"]


def parse(*flags: str):
    return parse_run_config([*REQUIRED, *flags])


@pytest.mark.parametrize(("flags", "bound"), [
    (["--train-mode", "sync"], 0),
    (["--train-mode", "one-step-off"], 1),
    (["--train-mode", "fully-async", "--max-staleness", "3"], 3),
    (["--train-mode", "fully-async"], None),  # unbounded
    (["--train-mode", "sync", "--debug-rollout-only"], None),  # the policy never changes: only capacity paces
])
def test_the_buffer_section_holds_the_staleness_bound_the_mode_implies(flags, bound):
    assert parse(*flags).buffer.max_staleness == bound


def test_a_max_staleness_that_contradicts_the_mode_fails_at_parse_and_one_that_agrees_passes():
    with pytest.raises(ConfigError, match=r"--max-staleness applies to --train-mode fully-async, not sync"):
        parse("--train-mode", "sync", "--max-staleness", "2")
    assert parse("--train-mode", "one-step-off", "--max-staleness", "1").buffer.max_staleness == 1


def test_the_routers_engine_calls_time_out_after_the_engine_request_timeout_unless_set():
    assert parse("--engine-request-timeout", "42").router.router_request_timeout == 42.0
    assert parse("--engine-request-timeout", "42", "--router-request-timeout", "7").router.router_request_timeout == 7.0


@pytest.mark.parametrize(("flags", "stream"), [
    ([], False),
    (["--weight-update-mode", "drain"], False),
    (["--weight-update-mode", "in_place"], True),  # requests run across an update: versions per token
    (["--weight-update-mode", "retract"], True),
    (["--weight-update-mode", "in_place", "--no-router-stream-generate"], False),
    (["--router-stream-generate"], True),
])
def test_the_router_streams_generate_calls_where_a_request_can_span_a_weight_update(flags, stream):
    assert parse(*flags).router.router_stream_generate is stream


def test_the_trainer_keeps_a_reference_model_when_a_kl_term_needs_it():
    assert not parse().trainer.use_reference
    assert parse("--use-kl-loss", "--kl-loss-coef", "0.01").trainer.use_reference
    assert parse("--kl-coef", "0.01").trainer.use_reference


def test_the_buffer_counts_every_group_admitted_per_weight_version():
    # 8 groups a step by default; over-sampling admits 12 a step, and a sync every 2 steps doubles that.
    assert parse().groups_per_version == 8
    assert parse("--over-sampling-batch-size", "12", "--update-weights-interval", "2").groups_per_version == 24


def test_greedy_rollouts_get_logprobs_at_temperature_one_others_at_their_own():
    assert RolloutConfig(rollout_temperature=0.0).logprob_temperature == 1.0
    assert RolloutConfig(rollout_temperature=0.7).logprob_temperature == 0.7


@pytest.mark.parametrize("flags", [
    ["--train-mode", "sync"],
    ["--train-mode", "fully-async", "--max-staleness", "2", "--num-steps-per-rollout", "4", "--kl-coef", "0.01"],
])
def test_the_runs_config_yaml_loads_back_to_the_same_resolved_config(tmp_path, flags):
    config = parse(*flags)
    dump_config(config, tmp_path / "config.yaml")
    assert config_to_dict(parse_run_config(["--config", str(tmp_path / "config.yaml")])) == config_to_dict(config)


@pytest.mark.parametrize(("flags", "capacity"), [
    (["--train-mode", "sync"], 64),  # (0 + 1) × 8 groups, at least 64
    (["--train-mode", "fully-async", "--max-staleness", "2", "--rollout-batch-size", "32"], 96),  # (2 + 1) × 32
    (["--train-mode", "fully-async", "--rollout-batch-size", "32"], 64),  # unbounded staleness
    (["--train-mode", "fully-async", "--max-staleness", "2", "--rollout-batch-size", "32",
      "--buffer-capacity", "40"], 40),  # set: kept
])
def test_the_buffer_holds_every_group_the_staleness_bound_admits_unless_its_capacity_is_set(flags, capacity):
    assert parse(*flags).buffer.buffer_capacity == capacity
