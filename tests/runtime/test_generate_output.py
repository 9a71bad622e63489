"""The stream of a /generate call assembled into the answer the plain call returns (generate_output.py).

Chunks are written by hand in SGLang 0.5.17's shapes (tokenizer_manager ``_handle_batch_output``):
cumulative by default, incremental with ``--incremental-streaming-output``; ``completion_tokens``
counts every token so far in both.
"""

from __future__ import annotations

import pytest

from slime_async.generate_output import SSEDecoder, StreamAssembler, parse_generate_output, stream_failure

TOKENS = [11, 12, 13, 14]
LOGPROBS = [-0.5, -1.0, -1.5, -2.0]
LENGTH = {"type": "length", "length": 4}


def chunk(ids: list[int], lps: list[float], version: str | None, total: int, finish=None, text=None) -> dict:
    meta = {"finish_reason": finish, "prompt_tokens": 3, "completion_tokens": total, "cached_tokens": 0,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}
    if version is not None:
        meta["weight_version"] = version
    out = {"output_ids": ids, "meta_info": meta}
    if text is not None:
        out["text"] = text
    return out


def cumulative(versions: list[str | None], upto: list[int] | None = None) -> list[dict]:
    """One chunk per end index in ``upto`` (default: one per token), cumulative."""
    ends = upto or list(range(1, len(TOKENS) + 1))
    return [chunk(TOKENS[:end], LOGPROBS[:end], versions[i], end, LENGTH if end == len(TOKENS) else None)
            for i, end in enumerate(ends)]


def assemble(chunks: list[dict], lag: int = 0) -> dict:
    assembler = StreamAssembler(version_lag=lag)
    for c in chunks:
        assembler.add(c)
    assert assembler.finished
    return assembler.answer()


def test_cumulative_chunks_assemble_into_the_plain_answer():
    answer = assemble(cumulative(["3"] * 4))
    out = parse_generate_output(answer)
    assert (out.output_ids, out.logprobs, out.finish_type) == (TOKENS, LOGPROBS, "length")
    assert out.token_versions == ["3"] * 4 and out.weight_version == "3"


def test_incremental_chunks_assemble_into_the_same_answer():
    chunks = [chunk([t], [lp], "3", i + 1, LENGTH if i == 3 else None, text=f"t{i}")
              for i, (t, lp) in enumerate(zip(TOKENS, LOGPROBS))]
    answer = assemble(chunks)
    out = parse_generate_output(answer)
    assert (out.output_ids, out.logprobs) == (TOKENS, LOGPROBS)
    assert answer["output_ids"] == TOKENS and answer["text"] == "t0t1t2t3"


def test_each_token_gets_the_version_of_the_chunk_that_first_reported_it():
    # Chunks coalesced by the engine bring two tokens at once: both take that chunk's version.
    answer = assemble(cumulative(["3", "4", "4"], upto=[1, 3, 4]))
    assert answer["meta_info"]["weight_version_segments"] == [["3", 1], ["4", 3]]
    assert parse_generate_output(answer).token_versions == ["3", "4", "4", "4"]


def test_a_version_lag_keeps_the_first_tokens_after_a_change_on_the_version_before_it():
    # SGLang's overlap scheduler streams the last step before a pause after the update.
    answer = assemble(cumulative(["3", "3", "4", "4"]), lag=1)
    assert answer["meta_info"]["weight_version_segments"] == [["3", 3], ["4", 1]]


def test_the_engines_own_segments_win_over_the_chunk_versions():
    chunks = cumulative(["3", "3", "4", "4"])
    chunks[-1]["meta_info"]["weight_version_segments"] = [["3", 1], ["4", 3]]
    assert assemble(chunks)["meta_info"]["weight_version_segments"] == [["3", 1], ["4", 3]]


def test_without_a_version_in_every_chunk_no_per_token_versions_are_made_up():
    answer = assemble(cumulative(["3", None, "4", "4"]))
    assert "weight_version_segments" not in answer["meta_info"]
    assert parse_generate_output(answer).token_versions is None


def test_an_abort_ends_the_stream_with_the_tokens_so_far():
    abort = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    chunks = cumulative(["3", "3"], upto=[1, 2])
    chunks.append(chunk(TOKENS[:2], LOGPROBS[:2], "3", 2, abort))
    out = parse_generate_output(assemble(chunks))
    assert (out.output_ids, out.logprobs, out.finish_type) == (TOKENS[:2], LOGPROBS[:2], "abort")
    assert stream_failure(chunks[-1]) is None  # an abort to resume from, not a failure


def test_a_request_aborted_in_the_waiting_queue_keeps_its_tokens():
    # SGLang's _handle_abort_req streams only the last output id, the logprobs and text in full.
    chunks = cumulative(["3", "3"], upto=[1, 2])
    last = chunk(TOKENS[1:2], LOGPROBS[:2], "3", 2, {"type": "abort", "message": "Abort in waiting queue"})
    last["meta_info"]["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(LOGPROBS[:2], TOKENS[:2])]
    answer = assemble(chunks + [last])
    assert answer["output_ids"] == TOKENS[:2]
    assert parse_generate_output(answer).logprobs == LOGPROBS[:2]


def test_a_chunk_that_does_not_continue_the_stream_is_an_error():
    assembler = StreamAssembler()
    assembler.add(chunk(TOKENS[:2], LOGPROBS[:2], "3", 2))
    with pytest.raises(ValueError, match="neither cumulative nor the new ones"):
        assembler.add(chunk(TOKENS[:1], LOGPROBS[:1], "3", 4))


def test_failed_requests_are_recognised_in_either_form():
    assert stream_failure({"error": {"message": "bad input", "type": "invalid_request_error", "code": 400}}) == (
        400, "bad input")
    failed = chunk([], [], "3", 0, {"type": "abort", "message": "engine step failed", "status_code": 500})
    assert stream_failure(failed) == (500, "engine step failed")


def test_the_sse_decoder_reassembles_events_split_anywhere():
    stream = b'data: {"a": 1}\n\ndata: {"b":\r\n\r\n: comment\ndata: [DONE]\n\n'
    for cut in range(len(stream)):
        decoder = SSEDecoder()
        events = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert events == [b'{"a": 1}', b'{"b":', b"[DONE]"]
