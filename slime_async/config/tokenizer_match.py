"""Preflight: two model directories share one tokenizer (vocabulary and special tokens).

On-policy distillation compares the student's and the teacher's log-probabilities of the same
token ids; if the two tokenizers map ids to different strings the comparison is meaningless
and training silently goes wrong, so a mismatch is refused at start, before any process is
spawned, with one line naming both directories and the first difference.
"""

from __future__ import annotations

from pathlib import Path


def tokenizer_mismatch(student_dir: str | Path, teacher_dir: str | Path) -> str | None:
    """None when both directories' tokenizers agree, else one line saying where they differ."""
    from transformers import AutoTokenizer  # heavy: loaded only when the check runs

    student = AutoTokenizer.from_pretrained(str(student_dir))
    teacher = AutoTokenizer.from_pretrained(str(teacher_dir))
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if len(s_vocab) != len(t_vocab):
        return f"vocabulary sizes differ: {len(s_vocab)} vs {len(t_vocab)}"
    for token, token_id in s_vocab.items():
        if t_vocab.get(token) != token_id:
            return f"token {token!r} is id {token_id} in the student, {t_vocab.get(token)} in the teacher"
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(student, name) != getattr(teacher, name):
            return f"{name} differs: {getattr(student, name)} vs {getattr(teacher, name)}"
    return None


def require_same_tokenizer(student_dir: str | Path, teacher_dir: str | Path, flag: str) -> None:
    """Raise ValueError (one line, naming the flag) when the tokenizers differ."""
    problem = tokenizer_mismatch(student_dir, teacher_dir)
    if problem is not None:
        raise ValueError(
            f"{flag}: the teacher {teacher_dir} and the student {student_dir} must share a tokenizer; {problem}")
