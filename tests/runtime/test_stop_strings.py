"""find_stop: where a completion is cut at a text stop string, against hand-worked cut points."""

from slime_async.stop_strings import find_stop

# A toy vocabulary: each id decodes to a fixed string, so expected cut points can be worked out by hand.
VOCAB = {1: "The", 2: " ans", 3: "wer", 4: " </", 5: "sea", 6: "rch>", 7: " x", 8: "rch>tail"}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def test_the_token_that_completes_a_stop_string_is_the_last_one_kept():
    # " </" + "sea" + "rch>" completes " </search>" at the sixth token; " x" after it is dropped.
    assert find_stop([1, 2, 3, 4, 5, 6, 7], decode, ["</search>"]) == (6, "</search>")


def test_a_stop_string_completed_inside_a_token_keeps_that_token():
    assert find_stop([4, 5, 8], decode, ["</search>"]) == (3, "</search>")


def test_a_stop_string_straddling_a_chunk_boundary_is_found_from_the_new_chunk():
    # Chunk 1 was ids[:5] (" </sea", no stop); chunk 2 brings "rch>".
    assert find_stop([1, 2, 3, 4, 5, 6], decode, ["</search>"], first=5) == (6, "</search>")
    assert find_stop([1, 2, 3], decode, ["</search>"]) is None


def test_the_earliest_stop_string_wins():
    assert find_stop([1, 2, 3, 4, 5, 6], decode, ["</search>", "answer"]) == (3, "answer")


# ----- StopSearch: the same answers chunk by chunk, decoding only the new tokens --------------------

import random  # noqa: E402

import pytest  # noqa: E402

from slime_async.incremental_text import IncrementalText  # noqa: E402
from slime_async.stop_strings import StopSearch  # noqa: E402

# Byte-level tokens, as byte-level BPE has them: "é" (c3 a9) and "✓" (e2 9c 93) split across tokens.
BYTES = {1: b"ok ", 2: b"caf", 3: b"\xc3", 4: b"\xa9", 5: b"!", 6: b" \xe2\x9c", 7: b"\x93", 8: b"</",
         9: b"search>", 10: b"\n", 11: b"\xe2", 12: b"\x9c\x93 done", 13: b"a", 14: b"</search>x"}


def decode_bytes(ids):
    return b"".join(BYTES[i] for i in ids).decode("utf-8", errors="replace")


def decode_sentencepiece(ids):
    """SentencePiece's rule: the text's first token loses its leading space (so a window differs)."""
    return "".join({1: " the", 2: " an", 3: "swer", 4: " is", 5: ":", 6: " 4", 7: "2"}[i] for i in ids).removeprefix(" ")


def feed_in_chunks(ids, decode, stops, sizes):
    """What the generation loop does: feed StopSearch after each chunk of ``sizes`` tokens."""
    search, produced = StopSearch(decode, stops), 0
    for size in sizes:
        chunk_end = min(len(ids), produced + size)
        hit = search.feed(ids[:chunk_end], first=produced)
        if hit is not None:
            return hit
        produced = chunk_end
        if produced == len(ids):
            return None
    return None


@pytest.mark.parametrize("ids, stops", [
    ([1, 2, 3, 4, 5], ["é!"]),  # a stop whose é arrives byte by byte, in two tokens
    ([1, 6, 7, 10], ["✓"]),  # a 3-byte stop split over two tokens
    ([1, 11, 12, 13], ["✓ d"]),  # ... and over a token that also brings the text after it
    ([2, 3, 4, 8, 9, 13], ["</search>", "café"]),  # the earliest stop wins, found mid-chunk
    ([1, 13, 14, 1], ["</search>"]),  # a stop completed inside one token
    ([1, 13, 1, 13], ["zzz"]),  # no stop at all
])
def test_the_incremental_search_cuts_where_the_full_search_does_for_every_chunking(ids, stops):
    expected = find_stop(ids, decode_bytes, stops)
    for size in range(1, len(ids) + 1):
        assert feed_in_chunks(ids, decode_bytes, stops, [size] * len(ids)) == expected, size


def test_a_stop_straddling_two_chunks_is_found_at_the_token_that_completes_it():
    # chunk 1: "ok </" ; chunk 2: "search>" completes it at token 3.
    assert feed_in_chunks([1, 8, 9, 1], decode_bytes, ["</search>"], [2, 2]) == (3, "</search>")


def test_a_decoder_that_drops_the_first_tokens_leading_space_is_matched_exactly():
    ids = [1, 2, 3, 4, 5, 6, 7]  # "the answer is: 42"
    for stops in (["is: 4"], ["the an"], [" 42"], ["answer is", "the"]):
        for size in (1, 2, 3):
            assert feed_in_chunks(ids, decode_sentencepiece, stops, [size] * 7) == find_stop(
                ids, decode_sentencepiece, stops), (stops, size)


def test_the_incremental_search_agrees_with_the_full_search_on_random_byte_level_cases():
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.choice(list(BYTES)) for _ in range(rng.randint(1, 12))]
        text = decode_bytes(ids)
        start = rng.randrange(len(text))
        stops = [text[start:start + rng.randint(1, 4)], rng.choice(["!", "é", "✓", "</se", "q"])]
        sizes = [rng.randint(1, 4) for _ in ids]
        assert feed_in_chunks(ids, decode_bytes, stops, sizes) == find_stop(ids, decode_bytes, stops), (ids, stops)


def test_incremental_text_is_the_full_decoding_after_every_chunk():
    rng = random.Random(1)
    for decode, vocab in ((decode_bytes, list(BYTES)), (decode_sentencepiece, list(range(1, 8)))):
        ids: list[int] = []
        text = IncrementalText(decode)
        for _ in range(40):
            ids += [rng.choice(vocab) for _ in range(rng.randint(1, 3))]
            assert text.advance(ids) == decode(ids)
        assert 0 < text.settled <= len(ids)


def test_incremental_text_decodes_only_a_few_tokens_per_chunk():
    calls: list[int] = []

    def counting(ids):
        calls.append(len(ids))
        return decode_bytes(ids)

    text, ids = IncrementalText(counting), []
    for _ in range(200):
        ids.append(13)  # "a"
        text.advance(ids)
    assert max(calls) <= 1 + 5  # the new token plus the context before it, never the whole list
