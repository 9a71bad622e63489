"""Checks of the paths a config names, run once at start (a section's ``preflight()``).

Each raises ValueError with one line naming the flag, so a wrong path fails before anything
is spawned rather than as a traceback from deep inside a loader minutes later.
"""

from __future__ import annotations

import os
from pathlib import Path

# What an HF model directory must hold for this runtime: transformers loads the architecture from
# config.json, the weights from safetensors (or legacy .bin) files, the tokenizer from one of these.
_WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model")


def require_file(path: str | Path, flag: str) -> Path:
    candidate = Path(path)
    if not candidate.exists():
        raise ValueError(f"{flag} {path}: no such file")
    if not candidate.is_file():
        raise ValueError(f"{flag} {path}: not a file")
    if not os.access(candidate, os.R_OK):
        raise ValueError(f"{flag} {path}: not readable (permission denied)")
    return candidate


def require_dir(path: str | Path, flag: str) -> Path:
    candidate = Path(path)
    if not candidate.exists():
        raise ValueError(f"{flag} {path}: no such directory")
    if not candidate.is_dir():
        raise ValueError(f"{flag} {path}: not a directory")
    if not os.access(candidate, os.R_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: not readable (permission denied)")
    return candidate


def require_writable_dir(path: str | Path, flag: str) -> Path:
    """``path`` is a directory the run can write in, or one it can create: its nearest existing
    ancestor is a writable directory (the run creates the rest)."""
    candidate = Path(path).absolute()
    existing = candidate
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == candidate else f" ({existing} is a file)"
        raise ValueError(f"{flag} {path}: not a directory{where}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {existing} is not writable (permission denied)")
    return candidate


def require_hf_model_dir(path: str | Path, flag: str, *, tokenizer: bool = True) -> Path:
    """``path`` is a local HF model directory: config.json, weights and (when asked) a tokenizer."""
    directory = Path(path)
    if not directory.exists():
        raise ValueError(f"{flag} {path}: no such directory (give a local HF model directory; "
                         "nothing is downloaded at run time)")
    require_dir(path, flag)
    if not (directory / "config.json").is_file():
        raise ValueError(f"{flag} {path}: no config.json there, so it is not an HF model directory")
    if not any(next(directory.glob(pattern), None) for pattern in _WEIGHT_PATTERNS):
        raise ValueError(f"{flag} {path}: no model weights there (*.safetensors or pytorch_model*.bin)")
    if tokenizer and not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise ValueError(f"{flag} {path}: no tokenizer there (one of {', '.join(_TOKENIZER_FILES)})")
    return directory
