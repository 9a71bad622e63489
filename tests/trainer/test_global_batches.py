"""A rollout split into optimizer steps: the global batches, and the metrics merged over them."""

import pytest

from actors.megatron.dp_split import split_into_global_batches
from actors.trainer.actor import mean_step_metrics


def test_a_rollout_splits_into_consecutive_global_batches_in_order():
    assert split_into_global_batches(6, 2) == [[0, 1], [2, 3], [4, 5]]


def test_no_global_batch_size_is_one_step_over_the_whole_batch():
    assert split_into_global_batches(5, None) == [[0, 1, 2, 3, 4]]


@pytest.mark.parametrize(("samples", "gbs"), [(6, 4), (0, 2), (6, 0)])
def test_an_uneven_split_names_the_flag(samples, gbs):
    with pytest.raises(ValueError, match="--global-batch-size"):
        split_into_global_batches(samples, gbs)


def test_step_metrics_are_averaged_counters_summed_and_the_step_is_the_last():
    merged = mean_step_metrics([
        {"pg_clipfrac": 0.0, "ppo_kl": 0.0, "num_micro_batches": 2.0, "step_time_s": 1.5, "step": 5.0},
        {"pg_clipfrac": 0.3, "ppo_kl": 0.02, "num_micro_batches": 3.0, "step_time_s": 0.5, "step": 6.0},
    ])
    assert merged == pytest.approx({"pg_clipfrac": 0.15, "ppo_kl": 0.01, "num_micro_batches": 5.0,
                                    "step_time_s": 2.0, "step": 6.0, "num_optimizer_steps": 2.0})
