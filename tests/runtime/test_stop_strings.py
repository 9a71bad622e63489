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
