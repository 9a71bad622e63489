"""The front's decode takes the Rust tokenizer directly (no per-id Python check) and must say
exactly what transformers' ``decode`` says."""

import random

from actors.router.text_model import _plain_backend


def test_decoding_through_the_backend_matches_the_tokenizers_own_decode(text_model):
    tokenizer = text_model.tokenizer
    assert _plain_backend(tokenizer) is not None  # the fast path is the one under test
    rng = random.Random(0)
    specials = tokenizer.all_special_ids
    for _ in range(50):
        ids = [rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            assert text_model.decode(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip)
    assert text_model.token_text(specials[0]) == tokenizer.decode([specials[0]])


def test_a_tokenizer_that_cleans_up_spaces_keeps_the_wrappers_decode(text_model):
    tokenizer = text_model.tokenizer
    before, tokenizer.clean_up_tokenization_spaces = tokenizer.clean_up_tokenization_spaces, True
    try:
        assert _plain_backend(tokenizer) is None
    finally:
        tokenizer.clean_up_tokenization_spaces = before
