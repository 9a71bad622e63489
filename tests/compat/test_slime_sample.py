"""Sample answers to slime's field names, statuses and methods, and keeps plug-in attributes."""

from __future__ import annotations

import orjson
import pytest

from actors.buffer import BufferActor, BufferConfig
from slime_async.actor import spawn
from slime_async.compat.slime.utils.types import Sample as SlimeSample
from slime_async.sample import Sample, Status


def fresh() -> Sample:
    return Sample(group_index=0, index=0, prompt="p", tokens=[1, 2])


def model_turn(tokens, finish="stop", version="3"):
    return {"output_token_logprobs": [[-0.5, t, None] for t in tokens], "finish_reason": {"type": finish},
            "weight_version": version}


def test_the_compat_sample_is_the_runtime_sample_with_slimes_status_names():
    assert SlimeSample is Sample
    assert Sample.Status.ABORTED is Status.ABORTED
    assert [s.name for s in Sample.Status] == ["PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]
    assert Sample(prompt="x").status == Sample.Status.PENDING  # slime builds samples by keyword


def test_rollout_log_probs_is_an_alias_and_none_reads_back_empty():
    sample = fresh()
    sample.rollout_log_probs = [-1.0, -2.0]
    assert sample.rollout_logprobs == [-1.0, -2.0]
    sample.rollout_log_probs = None
    assert sample.rollout_log_probs == [] and sample.rollout_logprobs == []


def test_append_response_tokens_adds_a_model_turn_with_version_status_and_text():
    sample = fresh()
    sample.append_response_tokens(None, tokens=[5, 6], log_probs=[-0.1, -0.2], trainable=True,
                                  meta_info=model_turn([5, 6], "length", "3"), text="ab")
    assert sample.tokens == [1, 2, 5, 6] and sample.response_length == 2
    assert sample.loss_mask == [1, 1] and sample.rollout_log_probs == [-0.1, -0.2]
    assert sample.token_versions == [3, 3] and sample.weight_versions == ["3"]
    assert sample.status is Sample.Status.TRUNCATED and sample.response == "ab"
    sample.check()


def test_append_response_tokens_adds_tool_output_untrained_at_the_last_version():
    sample = fresh()
    sample.append_response_tokens(None, tokens=[5], log_probs=[-0.1], meta_info=model_turn([5], "stop", "4"))
    sample.append_response_tokens(None, tokens=[7, 8], trainable=False, text="obs")
    assert sample.loss_mask == [1, 0, 0] and sample.rollout_log_probs == [-0.1, 0.0, 0.0]
    assert sample.token_versions == [4, 4, 4] and sample.status is Status.COMPLETED
    assert sample.effective_response_length == 1


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokens": [5], "trainable": True}, "require rollout log probabilities"),
    ({"tokens": [5], "log_probs": [-1.0], "trainable": False}, "should not pass rollout log probabilities"),
    ({"tokens": [5, 6], "log_probs": [-1.0]}, "log_probs length 1 != tokens length 2"),
])
def test_append_response_tokens_refuses_what_slime_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fresh().append_response_tokens(None, **kwargs)


def test_an_abort_finish_marks_the_sample_aborted():
    sample = fresh()
    sample.append_response_tokens(None, tokens=[], log_probs=[], meta_info=model_turn([], "abort"))
    assert sample.status is Sample.Status.ABORTED


def test_unknown_attributes_live_in_metadata_and_read_back():
    sample = fresh()
    sample.tool_call_count = 3
    assert sample.metadata["tool_call_count"] == 3 and sample.tool_call_count == 3
    assert getattr(sample, "never_set", "default") == "default"
    with pytest.raises(AttributeError, match="never_set"):
        sample.never_set


def test_slime_fields_without_a_use_here_read_as_slimes_defaults():
    sample = fresh()
    assert sample.multimodal_inputs is None and sample.rollout_top_p_token_ids is None
    assert sample.remove_sample is False and sample.apply_chat_template_kwargs == {}
    sample.rollout_top_p_token_ids = None  # both slime examples reset it
    assert sample.metadata == {"rollout_top_p_token_ids": None}


def test_from_dict_keeps_keys_it_does_not_know_in_metadata():
    data = {**fresh().to_dict(), "payload_text": "x"}
    assert Sample.from_dict(data).payload_text == "x"


async def test_a_sample_with_an_extra_attribute_survives_a_checkpoint_round_trip():
    # The path run checkpoints take: buffer state_dict -> run_state.json (orjson) -> load_state_dict.
    sample = fresh()
    sample.append_response_tokens(None, tokens=[5], log_probs=[-0.1], meta_info=model_turn([5]))
    sample.tool_call_count = 2
    sample.reward = 1.0
    sample.teacher_log_probs = [-0.5]  # slime's name of the OPD teacher's logprobs
    buffer = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=1))
    restored = await spawn(BufferActor(BufferConfig(buffer_capacity=4), groups_per_step=1))
    try:
        await buffer.ask("reserve")
        await buffer.ask("put", [sample])
        state = orjson.loads(orjson.dumps(await buffer.ask("state_dict")))
        await restored.ask("load_state_dict", state)
        [group] = await restored.ask("get", 1, 0)
    finally:
        await buffer.stop()
        await restored.stop()
    assert group[0] == sample
    assert group[0].tool_call_count == 2 and group[0].weight_versions == ["3"]
    assert group[0].teacher_logprobs == [-0.5]


def test_teacher_log_probs_is_slimes_name_of_the_opd_teachers_logprobs():
    sample = fresh()
    assert sample.teacher_log_probs is None  # unscored, as slime's default
    sample.teacher_log_probs = orjson.loads("[-1.5, -0.25]")
    assert sample.teacher_logprobs == [-1.5, -0.25] and "teacher_log_probs" not in sample.metadata
