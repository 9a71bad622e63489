"""build_train_batch: the batch's tokens, masks and advantages, worked out by hand, and the samples left as generated.

Two groups, dr_grpo (A_i = r_i − mean of its group), train version 2:

    sample   group  prompt  response (version)                    mask as generated  reward
    s0       0      [1, 2]  10 (v0), 11 (v0), 12 (tool), 13 (v2)   [1, 1, 0, 1]       1.0
    s1       0      [1, 2]  20 (v2)                                [1]                0.0
    s2       1      [3]     30 (v1), 31 (v1)                       [1, 1]             0.5
    s3       1      [3]     40 (v2)                                [1]                0.5

    group 0: mean 0.5 -> A = +0.5 (s0), −0.5 (s1); group 1: equal rewards -> A = 0 exactly.
    --mask-offpolicy-in-partial-rollout with --max-staleness 1 keeps tokens of version >= 2 − 1 = 1:
    s0's two v0 tokens lose their loss, so its mask is [0, 0, 0, 1] and its advantages [0, 0, 0, 0.5].
    Staleness of each sample's oldest trained token: s0 0, s1 0, s2 1, s3 0 -> mean 0.25, max 1;
    trained tokens 1 + 1 + 2 + 1 = 5, of which s2's 2 are older than version 2 -> off-policy fraction 0.4.
"""

import copy

import pytest

from actors.loop.batching import build_train_batch
from policies.algorithm import AlgorithmConfig
from slime_async.sample import Sample, Status

SPEC = AlgorithmConfig(advantage_estimator="dr_grpo")


def _sample(group: int, index: int, prompt: list[int], reward: float) -> Sample:
    s = Sample(group_index=group, index=index, prompt="p", tokens=list(prompt), reward=reward)
    s.status = Status.COMPLETED
    return s


@pytest.fixture
def groups() -> list[list[Sample]]:
    s0 = _sample(0, 0, [1, 2], 1.0)
    s0.append_generated([10, 11], [-0.1, -0.2], version=0)
    s0.append_observation([12])
    s0.append_generated([13], [-0.3], version=2)
    s1 = _sample(0, 1, [1, 2], 0.0)
    s1.append_generated([20], [-0.4], version=2)
    s2 = _sample(1, 0, [3], 0.5)
    s2.append_generated([30, 31], [-0.5, -0.6], version=1)
    s3 = _sample(1, 1, [3], 0.5)
    s3.append_generated([40], [-0.7], version=2)
    return [[s0, s1], [s2, s3]]


def _build(groups, **kwargs):
    return build_train_batch(groups, SPEC, train_version=2, temperature=0.8, **kwargs)


def test_tokens_lengths_logprobs_and_ids_are_the_samples_in_group_order(groups):
    batch, _ = _build(groups)
    assert batch.tokens == [[1, 2, 10, 11, 12, 13], [1, 2, 20], [3, 30, 31], [3, 40]]
    assert batch.response_lengths == [4, 1, 2, 1]
    assert batch.rollout_logprobs == [[-0.1, -0.2, 0.0, -0.3], [-0.4], [-0.5, -0.6], [-0.7]]
    assert batch.sample_ids == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert batch.temperature == 0.8


def test_advantages_are_per_response_token_unpadded_and_zero_on_tool_output(groups):
    batch, _ = _build(groups)
    assert batch.loss_masks == [[1, 1, 0, 1], [1], [1, 1], [1]]
    assert batch.advantages == [[0.5, 0.5, 0.0, 0.5], [-0.5], [0.0, 0.0], [0.0]]


def test_the_offpolicy_mask_zeroes_the_loss_and_advantage_of_too_old_tokens(groups):
    batch, metrics = _build(groups, max_staleness=1, mask_offpolicy=True)
    assert batch.loss_masks == [[0, 0, 0, 1], [1], [1, 1], [1]]
    assert batch.advantages == [[0.0, 0.0, 0.0, 0.5], [-0.5], [0.0, 0.0], [0.0]]
    assert metrics["rollout/staleness_mean"] == 0.25
    assert metrics["rollout/staleness_max"] == 1.0
    assert metrics["rollout/offpolicy_token_frac"] == pytest.approx(0.4)
    # s0's two v0 tokens; every sample keeps a trained token
    assert (metrics["rollout/masked_stale_tokens"], metrics["rollout/masked_stale_samples"]) == (2, 0)


def test_a_sample_the_offpolicy_mask_leaves_without_a_trained_token_is_counted(groups):
    # --max-staleness 0 at version 2 keeps only v2 tokens: s0 loses its two v0 tokens (keeps 13),
    # s2 loses both of its v1 tokens and has none left -> 4 tokens, 1 sample
    _, metrics = _build(groups, max_staleness=0, mask_offpolicy=True)
    assert (metrics["rollout/masked_stale_tokens"], metrics["rollout/masked_stale_samples"]) == (4, 1)


def test_without_the_offpolicy_mask_no_masked_metrics_are_reported(groups):
    _, metrics = _build(groups, max_staleness=1)
    assert "rollout/masked_stale_tokens" not in metrics


def test_building_a_batch_leaves_the_samples_as_generated(groups):
    before = [[s.to_dict() for s in group] for group in copy.deepcopy(groups)]
    _build(groups, max_staleness=1, mask_offpolicy=True)
    assert [[s.to_dict() for s in group] for group in groups] == before
    assert groups[0][0].loss_mask == [1, 1, 0, 1]
