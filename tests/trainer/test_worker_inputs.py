"""What the trainer ranks receive: the Batch built from samples, the Megatron pass-through routing."""

from __future__ import annotations

import pytest
import torch

from actors.megatron.config import TrainerConfig
from actors.megatron.options import split_megatron_overrides
from slime_async.batch import Batch, batch_from_samples
from slime_async.sample import Sample, Status


def _sample(index: int, prompt: list[int], generated: list[int], tool: list[int] = ()) -> Sample:
    s = Sample(group_index=0, index=index, prompt="p", tokens=list(prompt), status=Status.COMPLETED)
    s.append_generated(generated, [-0.5] * len(generated), version=3)
    if tool:
        s.append_observation(list(tool))
    return s


def test_batch_from_samples_keeps_tokens_masks_and_rollout_logprobs():
    samples = [_sample(0, [1, 2], [5, 6], tool=[9]), _sample(1, [1, 2, 3], [7])]
    batch = batch_from_samples(samples, advantages=[[1.0, 1.0, 0.0], [-1.0]], temperature=0.8)
    assert batch.tokens == [[1, 2, 5, 6, 9], [1, 2, 3, 7]]
    assert batch.response_lengths == [3, 1]
    assert batch.loss_masks == [[1, 1, 0], [1]]
    assert batch.rollout_logprobs == [[-0.5, -0.5, 0.0], [-0.5]]
    assert batch.temperature == 0.8
    assert batch.sample_ids == [(0, 0), (0, 1)]


def test_batch_rejects_per_token_rows_of_the_wrong_length():
    with pytest.raises(ValueError, match="sample 1: advantages has 2 entries for response_length 1"):
        Batch(tokens=[[1, 2, 3], [1, 2]], response_lengths=[2, 1], loss_masks=[[1, 1], [1]], advantages=[[0.0, 0.0], [0.0, 0.0]])


def test_batch_needs_a_prompt_token_before_the_response():
    with pytest.raises(ValueError, match="response_length 2 with 2 tokens"):
        Batch(tokens=[[1, 2]], response_lengths=[2], loss_masks=[[1, 1]])


def test_select_takes_the_samples_in_the_given_order():
    batch = Batch(tokens=[[1, 2], [3, 4, 5], [6, 7]], response_lengths=[1, 2, 1], loss_masks=[[1], [1, 0], [1]])
    picked = batch.select([2, 0])
    assert picked.tokens == [[6, 7], [1, 2]] and picked.loss_masks == [[1], [1]]


def test_normalizer_is_the_global_denominator_of_each_aggregation():
    batch = Batch(tokens=[[1, 2, 3], [1, 2, 3, 4]], response_lengths=[2, 3], loss_masks=[[1, 1], [1, 0, 1]])
    assert batch.normalizer("token_mean") == 4.0  # masked tokens of the whole batch
    assert batch.normalizer("seq_mean_token_mean") == 2.0
    assert batch.normalizer("seq_mean_token_sum_norm", max_response_len=8) == 16.0
    with pytest.raises(ValueError, match="max_response_len"):
        batch.normalizer("seq_mean_token_sum_norm")


def test_megatron_pass_through_goes_to_every_dataclass_that_has_the_field():
    sections = split_megatron_overrides(
        {"tensor_model_parallel_size": 2, "bf16": True, "lr": 1e-6, "clip_grad": 0.5,
         "overlap_grad_reduce": True, "lr_warmup_iters": 10, "params_dtype": "torch.bfloat16"}
    )
    assert sections.transformer == {"tensor_model_parallel_size": 2, "bf16": True, "params_dtype": torch.bfloat16}
    assert sections.optimizer == {"bf16": True, "lr": 1e-6, "clip_grad": 0.5, "params_dtype": torch.bfloat16}
    assert sections.ddp == {"overlap_grad_reduce": True}
    assert sections.schedule == {"lr_warmup_iters": 10}


def test_unknown_megatron_option_fails_with_its_name():
    with pytest.raises(ValueError, match="not_a_megatron_field"):
        split_megatron_overrides({"not_a_megatron_field": 1})


def test_trainer_config_needs_a_micro_batching_rule():
    with pytest.raises(ValueError, match="max-tokens-per-gpu and --micro-batch-size"):
        TrainerConfig(hf_checkpoint="/m", max_tokens_per_gpu=None).validate()


def test_a_fixed_micro_batch_size_replaces_the_token_budget():
    config = TrainerConfig(hf_checkpoint="/m", micro_batch_size=2).validate()
    assert config.max_tokens_per_gpu is None


def test_trainer_config_travels_as_json():
    config = TrainerConfig(hf_checkpoint="/m", max_tokens_per_gpu=128, megatron={"lr": 1e-6, "params_dtype": torch.bfloat16})
    again = TrainerConfig.from_json(config.to_json())
    assert again.max_tokens_per_gpu == 128
    assert again.megatron == {"lr": 1e-6, "params_dtype": "torch.bfloat16"}


# --------------------------------------------------------------------------------------------
# Micro-batches grown to a shape agreed with other ranks (MoE experts spread over ranks)
# --------------------------------------------------------------------------------------------


def _two_samples() -> Batch:
    return Batch(tokens=[[3, 4, 5, 6, 7], [8, 9, 10]], response_lengths=[2, 1], loss_masks=[[1, 1], [1]])


@pytest.mark.parametrize("pack, pad_to", [(False, (3, 7)), (True, (12,))])
def test_a_micro_batch_padded_to_an_agreed_shape_scores_the_same_tokens(pack, pad_to):
    from actors.trainer.ops import _micro_batch_tensors

    plain = _micro_batch_tensors(_two_samples(), torch.device("cpu"), pack=pack)
    grown = _micro_batch_tensors(_two_samples(), torch.device("cpu"), pack=pack, pad_to=pad_to)
    assert tuple(grown["tokens"].shape) == ((1, *pad_to) if pack else pad_to)
    assert grown["padding_mask"].shape == grown["tokens"].shape
    assert torch.equal(grown["targets"], plain["targets"])  # [[6, 7], [10, <masked>]]
    assert torch.equal(grown["tokens"].reshape(-1)[grown["flat_positions"][grown["valid"]]],
                       plain["tokens"].reshape(-1)[plain["flat_positions"][plain["valid"]]])
    # The pad tokens, and only they, are marked: 8 real tokens in either layout.
    assert int((~grown["padding_mask"]).sum()) == 8
    assert torch.equal(grown["tokens"][~grown["padding_mask"]], plain["tokens"][~plain["padding_mask"]])
    if pack:  # the pad tokens form one more sequence of their own
        assert grown["packed_seq_params"].cu_seqlens_q.tolist() == [0, 5, 8, 12]


def test_a_filler_micro_batch_is_a_sample_with_nothing_to_train():
    from actors.megatron.mb_align import zero_loss_copy

    filler = zero_loss_copy(_two_samples())
    assert filler.tokens == [[3, 4, 5, 6, 7]] and filler.loss_masks == [[0, 0]]
