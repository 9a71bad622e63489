"""The text side of the model for the HTTP front: tokenizer, chat template, context length.

Engines run with ``--skip-tokenizer-init`` (token ids in, token ids out), so whatever the front
accepts as text is tokenized here, and every completion is decoded here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.router.tool_calls import ToolParser, choose_parser


@dataclass
class TextModel:
    """A tokenizer plus what the front needs to know about the model it belongs to."""

    tokenizer: Any
    name: str
    context_len: int | None = None  # max_position_embeddings; None = let the engine decide
    vocab_size: int | None = None  # a client's token ids are checked against it (slime_async/token_ids.py)
    tool_parser: ToolParser = "hermes"
    # --use-rollout-routing-replay: the MoE layout; recorded sessions' turns then carry routed experts
    routed_layout: Any = None

    @classmethod
    def load(cls, model_path: str | Path, *, tokenizer: Any = None, served_name: str | None = None,
             tool_parser: str = "auto") -> TextModel:
        """Read ``model_path`` (an HF directory); ``tokenizer`` skips loading one again."""
        path = Path(model_path)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(path))
        config = _read_json(path / "config.json")
        if tool_parser == "auto":
            tool_parser = choose_parser(getattr(tokenizer, "chat_template", None), config.get("model_type"))
        if tool_parser not in ("hermes", "llama3_json", "none"):
            raise ValueError(f"--router-tool-parser must be auto, hermes, llama3_json or none, got {tool_parser!r}")
        return cls(tokenizer=tokenizer, name=served_name or path.name, context_len=config.get("max_position_embeddings"),
                   vocab_size=config.get("vocab_size"), tool_parser=tool_parser)  # type: ignore[arg-type]

    def encode(self, text: str) -> list[int]:
        """Rendered chat text: the template already wrote any BOS."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """Raw prompt text (/generate ``text``, /v1/completions): tokenized as SGLang does,
        with the tokenizer's own special-token rule."""
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        backend = _plain_backend(self.tokenizer)
        if backend is not None:
            return backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text of a chat request: the model's template with the generation prompt."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"the tokenizer of {self.name} has no chat template; use /v1/completions or /generate")
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False, **(template_kwargs or {}))


def _plain_backend(tokenizer: Any) -> Any:
    """The Rust tokenizer under a fast HF tokenizer whose ``decode`` would only call it, else None.

    transformers' ``decode`` first converts the ids with ``to_py_obj``, a Python check of every
    id: 90% of a decode's time, and the front decodes after every chunk of every stream (at
    1,000 streaming sessions, 2.3 of the router's 3 s of decoding; docs/agents.md "The front
    under load"). Taken only where the wrapper adds nothing: transformers' own fast ``_decode``
    (not a model's override) and no ``clean_up_tokenization_spaces``."""
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # another transformers layout: the wrapper, always right
        return None
    if type(tokenizer)._decode is not TokenizersBackend._decode or tokenizer.clean_up_tokenization_spaces:
        return None
    return tokenizer.backend_tokenizer


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return json.loads(path.read_text())

