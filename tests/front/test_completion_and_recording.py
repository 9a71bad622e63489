"""The front's generation loop (chunks, stop strings, resume after an abort) against a scripted
router, and trajectory recording and assembly, with hand-written expected values."""

import pytest

from actors.router.completion import CompletionSpec, complete
from actors.router.recorder import SessionRecorder, TrajectoryError
from slime_async.sample import Sample, Status
from slime_async.trajectory import RecordedChoice, RecordedTurn, prompt_ids, to_samples

VOCAB = {10: "a", 11: "b", 12: "<", 13: "/s>", 14: "c"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


class ScriptedRouter:
    """Answers requests from a list of (ids, finish type, weight version), recording what it got."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.sent = []

    async def __call__(self, input_ids, params):
        self.sent.append((list(input_ids), params["max_new_tokens"]))
        ids, finish, version = self.answers.pop(0)
        ids = ids[:params["max_new_tokens"]] if params["max_new_tokens"] is not None else ids
        return {"output_ids": ids, "meta_info": {"finish_reason": {"type": finish},
                                                 "output_token_logprobs": [[-1.0, t, None] for t in ids],
                                                 "weight_version": version}}


async def test_an_aborted_request_resumes_from_its_tokens_with_the_remaining_budget():
    router = ScriptedRouter([([10, 11], "abort", "3"), ([14], "stop", "4")])
    out = await complete(router, CompletionSpec([1, 2], {"temperature": 1.0}, max_new_tokens=5), decode)
    assert router.sent == [([1, 2], 5), ([1, 2, 10, 11], 3)]
    assert out.output_ids == [10, 11, 14] and out.weight_versions == ["3", "3", "4"]
    assert out.finish_type == "stop" and out.resumes == 1


async def test_chunks_continue_until_a_stop_string_and_cut_after_its_last_token():
    # Chunks of 2: "ab", "</s>" completes in the second chunk, whose extra token "c" ... never arrives.
    router = ScriptedRouter([([10, 11], "length", "0"), ([12, 13], "length", "0")])
    spec = CompletionSpec([1], {}, max_new_tokens=100, stop=("</s>",), chunk_tokens=2)
    out = await complete(router, spec, decode)
    assert [budget for _, budget in router.sent] == [2, 2]  # two small requests, not a 100-token one
    assert out.output_ids == [10, 11, 12, 13] and out.finish_reason == {"type": "stop", "matched": "</s>"}


async def test_tokens_after_the_stop_string_in_the_same_chunk_are_dropped():
    router = ScriptedRouter([([12, 13, 14, 10], "length", "0")])
    out = await complete(router, CompletionSpec([1], {}, 4, stop=("</s>",), chunk_tokens=4), decode)
    assert out.output_ids == [12, 13] and len(out.logprobs) == len(out.weight_versions) == 2


async def test_the_budget_ends_a_chunked_completion_with_length():
    router = ScriptedRouter([([10, 10], "length", "0"), ([11], "length", "0")])
    out = await complete(router, CompletionSpec([1], {}, 3, stop=("zz",), chunk_tokens=2), decode)
    assert [budget for _, budget in router.sent] == [2, 1]
    assert out.output_ids == [10, 10, 11] and out.finish_reason == {"type": "length", "length": 3}


async def test_the_context_end_stops_a_completion_without_a_budget():
    router = ScriptedRouter([([10, 10], "length", "0")])
    out = await complete(router, CompletionSpec([1, 2], {}, None, chunk_tokens=2), decode, context_len=4)
    assert len(router.sent) == 1 and out.finish_type == "length"


# ----- recording -----------------------------------------------------------------------------------


def choice(ids, versions=None, finish="stop"):
    return RecordedChoice(list(ids), [-0.5 * (i + 1) for i in range(len(ids))], versions or ["0"] * len(ids), finish)


def test_a_turn_that_extends_the_previous_one_stores_only_its_new_ids():
    recorder = SessionRecorder(max_sessions=4, max_turns=8)
    recorder.record("s", [1, 2], [choice([3, 4])])
    recorder.record("s", [1, 2, 3, 4, 5], [choice([6])])
    recorder.record("s", [9, 9], [choice([7])])  # re-rendered history: extends nothing
    turns = recorder.take("s")
    assert [(t.parent, t.new_ids) for t in turns] == [(None, [1, 2]), ((0, 0), [5]), (None, [9, 9])]
    assert prompt_ids(turns, 1) == [1, 2, 3, 4, 5]


def test_recorded_ids_cost_the_garbage_collector_nothing_and_come_back_as_lists():
    import gc

    recorder = SessionRecorder(max_sessions=4, max_turns=8)
    recorder.record("s", list(range(500)), [choice([3, 4])])
    recorder.record("s", list(range(500)) + [3, 4, 5], [choice([6])])
    gc.collect()  # a tuple of ints is untracked the first time the collector sees it
    stored = recorder._sessions["s"].turns
    assert not any(gc.is_tracked(ids) for t in stored for ids in (t.new_ids, t.choices[0].output_ids))
    turns = recorder.take("s")
    assert turns[1].parent == (0, 0) and turns[1].new_ids == [5] and turns[0].choices[0].output_ids == [3, 4]
    assert all(type(ids) is list for t in turns for ids in (t.new_ids, t.choices[0].logprobs))


def test_text_prefix_gives_the_exact_ids_of_the_longest_recorded_prompt_and_completion():
    recorder = SessionRecorder(max_sessions=4, max_turns=8)
    recorder.record("s", [1, 2], [choice([3]), choice([4, 4])], text="P:", choice_texts=["x", "yy"])
    assert recorder.text_prefix("s", "P:yy and more") == ((0, 1), 4, [1, 2, 4, 4])
    assert recorder.text_prefix("s", "P:x!") == ((0, 0), 3, [1, 2, 3])
    assert recorder.text_prefix("s", "Q:") is None and recorder.text_prefix("other", "P:") is None
    recorder.record("s", [1, 2, 4, 4, 8], [choice([5])], text="P:yy!", choice_texts=["z"], text_parent=((0, 1), 4))
    assert recorder.text_prefix("s", "P:yy!z?") == ((1, 0), 6, [1, 2, 4, 4, 8, 5])


def test_the_recorder_forgets_the_least_recently_used_session_beyond_its_cap():
    recorder = SessionRecorder(max_sessions=2, max_turns=8)
    for session in ("a", "b", "c"):
        recorder.record(session, [1], [choice([2])])
    assert len(recorder) == 2 and recorder.evictions == 1
    with pytest.raises(TrajectoryError, match="--router-max-recorded-sessions"):
        recorder.take("a")
    recorder.take("b")
    with pytest.raises(TrajectoryError, match="no requests were recorded"):
        recorder.take("b")  # collected sessions are forgotten


def test_a_session_longer_than_the_turn_cap_fails_when_collected():
    recorder = SessionRecorder(max_sessions=2, max_turns=1)
    recorder.record("s", [1], [choice([2])])
    recorder.record("s", [1, 2, 3], [choice([4])])
    with pytest.raises(TrajectoryError, match="--router-max-recorded-turns"):
        recorder.take("s")


def test_recording_off_records_nothing():
    recorder = SessionRecorder(max_sessions=0, max_turns=1)
    recorder.record("s", [1], [choice([2])])
    assert len(recorder) == 0


# ----- assembly into samples ---------------------------------------------------------------------------


def sample():
    return Sample(group_index=3, index=1, prompt="p", tokens=[100, 101], label="L", session_id="group-3")


def test_an_extending_trajectory_is_one_sample_with_only_model_tokens_trainable():
    turns = [
        RecordedTurn(None, [1, 2], [choice([3, 4], versions=["0", "1"])]),  # resumed across a weight sync
        RecordedTurn((0, 0), [5, 6], [choice([7], finish="length")]),
    ]
    [piece] = to_samples(turns, sample())
    assert piece.tokens == [1, 2, 3, 4, 5, 6, 7] and piece.response_length == 5
    assert piece.loss_mask == [1, 1, 0, 0, 1]
    assert piece.rollout_logprobs == [-0.5, -1.0, 0.0, 0.0, -0.5]
    assert piece.token_versions == [0, 1, 1, 1, 0]
    assert piece.status is Status.TRUNCATED and piece.label == "L"
    assert piece.metadata["trajectory_parts"] == 1


def test_a_turn_that_does_not_extend_starts_another_sample():
    turns = [
        RecordedTurn(None, [1, 2], [choice([3])]),
        RecordedTurn(None, [1, 9, 3, 4], [choice([5])]),  # the template re-rendered turn 1 differently
    ]
    first, second = to_samples(turns, sample())
    assert (first.tokens, first.loss_mask) == ([1, 2, 3], [1])
    assert (second.tokens, second.loss_mask, second.prompt_length) == ([1, 9, 3, 4, 5], [1], 4)
    assert [p.metadata["trajectory_part"] for p in (first, second)] == [0, 1]
    assert second.group_index == 3 and second.index == 1


def test_of_several_choices_the_one_the_next_turn_continues_is_kept():
    turns = [RecordedTurn(None, [1], [choice([2]), choice([3])]), RecordedTurn((0, 1), [4], [choice([5])])]
    [piece] = to_samples(turns, sample())
    assert piece.tokens == [1, 3, 4, 5] and piece.loss_mask == [1, 0, 1]


def test_interleaved_branches_of_one_session_each_continue_their_own_sample():
    turns = [
        RecordedTurn(None, [1], [choice([2])]),
        RecordedTurn(None, [7], [choice([8])]),
        RecordedTurn((0, 0), [3], [choice([4])]),
        RecordedTurn((1, 0), [9], [choice([6])]),
    ]
    first, second = to_samples(turns, sample())
    assert first.tokens == [1, 2, 3, 4] and second.tokens == [7, 8, 9, 6]


def test_nothing_recorded_is_an_error():
    with pytest.raises(ValueError, match="no turns"):
        to_samples([], sample())
