"""What the agent examples' data writers share: the chat tokenizer they render prompts with.

A writer run with ``--chat-tokenizer DIR`` (any HF tokenizer directory with a chat template,
e.g. SmolLM2-135M-Instruct's) writes prompts as chat messages; a directory that is no tokenizer,
or one without a template, ends the writer with one line before anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def load_chat_tokenizer(path: Path, flag: str = "--chat-tokenizer") -> Any:
    """The tokenizer at ``path``; one line on stderr and exit code 2 unless it has a chat template."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as error:
        _fail(f"{flag} {path}: not a tokenizer directory ({str(error).splitlines()[0]})")
    if not tokenizer.chat_template:
        _fail(f"{flag} {path}: the tokenizer has no chat template")
    return tokenizer


def _fail(message: str) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(2)
