"""The teacher/student tokenizer check of on-policy distillation, on real tokenizer dirs."""

import pytest

from examples.models.tiny import train_tokenizer
from slime_async.config.tokenizer_match import require_same_tokenizer, tokenizer_mismatch


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    dirs = {}
    for name, vocab in (("a", 300), ("b", 300), ("small", 280)):
        dirs[name] = root / name
        train_tokenizer(vocab, seed=0).save_pretrained(str(dirs[name]))
    return dirs


def test_identical_tokenizers_pass(tokenizer_dirs):
    assert tokenizer_mismatch(tokenizer_dirs["a"], tokenizer_dirs["b"]) is None
    require_same_tokenizer(tokenizer_dirs["a"], tokenizer_dirs["b"], "--opd-teacher-hf-checkpoint")


def test_different_vocabularies_are_refused_in_one_line_naming_the_flag(tokenizer_dirs):
    with pytest.raises(ValueError) as err:
        require_same_tokenizer(tokenizer_dirs["a"], tokenizer_dirs["small"], "--opd-teacher-hf-checkpoint")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("--opd-teacher-hf-checkpoint:")
    assert "vocabulary sizes differ" in message
