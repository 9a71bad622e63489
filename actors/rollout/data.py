"""Prompt data: rows of a JSONL or Parquet file, tokenized once, served epoch by epoch.

Every row is validated and tokenized when the dataset is built, so a malformed row is reported
once at start (its JSONL line number, 1-based, or its Parquet row index, 0-based), counted in
``bad_rows`` and skipped; the run fails only when no row at all is usable.

Order: epoch ``e`` visits the rows in a permutation drawn from ``random.Random(seed + e)``, so
the order is a pure function of (seed, epoch) and a cursor ``(epoch, position)`` is all a
checkpoint needs: ``state_dict()`` / ``load_state_dict()`` resume exactly where the run stopped,
neither skipping nor repeating a prompt. ``next_prompt()`` returns None once ``num_epoch``
epochs are done (None rather than StopIteration because the rollout asks for one prompt at a
time, from inside an actor, and "no more data" is a normal outcome there, not an error).
"""

from __future__ import annotations

import array
import copy
import json
import logging
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from actors.rollout.config import RolloutConfig

log = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl",)
PARQUET_SUFFIXES = (".parquet",)


@dataclass
class Prompt:
    """One prompt as the rollout consumes it."""

    index: int  # position of the row among the dataset's usable rows (stable across epochs)
    epoch: int
    prompt: str | list[dict[str, Any]]  # the row's input as written: text or chat messages
    prompt_ids: list[int]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prompt:
        return cls(**data)


@dataclass
class _Row:
    prompt: str | list[dict[str, Any]]
    prompt_ids: array.array  # compact: a Python list costs ~8x the memory per token id
    label: Any
    metadata: dict[str, Any]


class BadRow(ValueError):
    """A row that cannot become a prompt; the message says why."""


class PromptDataset:
    """Prompts from ``prompt_data`` (.jsonl or .parquet), tokenized with ``tokenizer``.

    ``apply_chat_template``: a string input becomes one user message, a list input is taken as
    chat messages; either is rendered with the tokenizer's chat template
    (``add_generation_prompt=True`` plus ``apply_chat_template_kwargs``). Without it the input
    must be a string. The rendered text is tokenized without adding special tokens (a chat
    template already writes its own). ``max_context_len``: a prompt of that many tokens or more
    leaves no room for a response and is skipped as a bad row. ``require_label``: a row without
    a label (key missing or null) is a bad row; built-in rewards and SFT need one, a custom reward
    function may not. ``num_epoch`` None cycles forever.
    """

    def __init__(
        self,
        prompt_data: str | Path,
        tokenizer: Any,
        *,
        input_key: str = "prompt",
        label_key: str = "label",
        metadata_key: str = "metadata",
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict[str, Any] | None = None,
        max_context_len: int | None = None,
        require_label: bool = False,
        shuffle: bool = True,
        seed: int = 42,
        num_epoch: int | None = 1,
    ):
        if num_epoch is not None and num_epoch <= 0:
            raise ValueError(f"num_epoch must be > 0 or None, got {num_epoch}")
        self.path = Path(prompt_data)
        self.tokenizer = tokenizer
        self.input_key = input_key
        self.label_key = label_key
        self.metadata_key = metadata_key
        self.apply_chat_template = apply_chat_template
        self.apply_chat_template_kwargs = dict(apply_chat_template_kwargs or {})
        self.max_context_len = max_context_len
        self.require_label = require_label
        self.shuffle = shuffle
        self.seed = seed
        self.num_epoch = num_epoch
        self._bad_rows = 0
        self._rows = self._load()
        # Cursor: the next prompt is _order[_position] of epoch _epoch.
        self._epoch = 0
        self._position = 0
        self._order = self._epoch_order(0)

    # ----- loading ----------------------------------------------------------------------------
    def _load(self) -> list[_Row]:
        if not self.path.is_file():
            raise FileNotFoundError(f"prompt data {self.path} does not exist")
        suffix = self.path.suffix.lower()
        if suffix in JSONL_SUFFIXES:
            records, where = self._read_jsonl(), "line"
        elif suffix in PARQUET_SUFFIXES:
            records, where = self._read_parquet(), "row"
        else:
            raise ValueError(
                f"prompt data {self.path}: unsupported format {suffix!r} "
                f"(expected {', '.join(JSONL_SUFFIXES + PARQUET_SUFFIXES)})"
            )
        rows: list[_Row] = []
        total = 0
        for number, record in records:
            total += 1
            try:
                if isinstance(record, BadRow):
                    raise record
                rows.append(self._make_row(record))
            except BadRow as error:
                self._bad_rows += 1
                log.warning("prompt data %s: %s %d skipped: %s", self.path, where, number, error)
        if not rows:
            raise ValueError(
                f"prompt data {self.path}: none of its {total} rows is usable "
                f"(input key {self.input_key!r}; see the warnings above for each row)"
            )
        if self._bad_rows:
            log.warning("prompt data %s: %d of %d rows skipped as malformed", self.path, self._bad_rows, total)
        return rows

    def _read_jsonl(self) -> Iterator[tuple[int, Any]]:
        """(1-based line number, parsed object or BadRow); blank lines are not rows."""
        with self.path.open("rb") as f:  # bytes: one undecodable line must not end the read
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    yield number, BadRow(f"not UTF-8 ({error.reason} at byte {error.start})")
                    continue
                if not line.strip():
                    continue
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as error:
                    yield number, BadRow(f"invalid JSON ({error.msg} at column {error.colno})")

    def _read_parquet(self) -> Iterator[tuple[int, Any]]:
        """(0-based row index, row dict), one record batch at a time to bound memory."""
        import pyarrow.parquet as pq

        try:
            batches = pq.ParquetFile(self.path).iter_batches()
        except Exception as error:  # noqa: BLE001 - pyarrow's errors do not name the file
            raise ValueError(f"prompt data {self.path}: not a readable Parquet file: {error}") from error
        index = 0
        for batch in batches:
            for record in batch.to_pylist():
                yield index, record
                index += 1

    def _make_row(self, record: Any) -> _Row:
        if not isinstance(record, dict):
            raise BadRow(f"expected a JSON object, got {type(record).__name__}")
        if self.input_key not in record:
            raise BadRow(f"missing input key {self.input_key!r} (keys: {sorted(record)})")
        prompt = record[self.input_key]
        if self.require_label and record.get(self.label_key) is None:
            raise BadRow(f"missing label key {self.label_key!r} (keys: {sorted(record)}); the built-in "
                         "--rm-type rewards and --loss-type sft need one, a --custom-rm-path reward does not")
        text = self._render(prompt)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BadRow("the prompt tokenizes to nothing")
        if self.max_context_len is not None and len(ids) >= self.max_context_len:
            raise BadRow(f"the prompt has {len(ids)} tokens, leaving no room under --rollout-max-context-len "
                         f"{self.max_context_len}")
        metadata = record.get(self.metadata_key)
        if metadata is None:
            metadata = {}
        elif isinstance(metadata, str):
            # Parquet writers often store a dict column as a JSON string.
            try:
                metadata = json.loads(metadata)
            except json.JSONDecodeError:
                raise BadRow(f"{self.metadata_key!r} is a string but not JSON") from None
        if not isinstance(metadata, dict):
            raise BadRow(f"{self.metadata_key!r} must be an object, got {type(metadata).__name__}")
        return _Row(prompt, array.array("l", ids), record.get(self.label_key), metadata)

    def _render(self, prompt: Any) -> str:
        return render_prompt(self.tokenizer, prompt, apply_chat_template=self.apply_chat_template,
                             chat_template_kwargs=self.apply_chat_template_kwargs, input_key=self.input_key)

    # ----- iteration --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows)

    @property
    def bad_rows(self) -> int:
        """Rows skipped as malformed when the file was loaded."""
        return self._bad_rows

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def exhausted(self) -> bool:
        return self.num_epoch is not None and self._epoch >= self.num_epoch

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_prompt(self) -> Prompt | None:
        """The next prompt, or None after ``num_epoch`` epochs."""
        if self.exhausted:
            return None
        index = self._order[self._position]
        prompt = self._prompt(index, self._epoch)
        self._position += 1
        if self._position == len(self._order):
            self._epoch += 1
            self._position = 0
            if not self.exhausted:
                self._order = self._epoch_order(self._epoch)
        return prompt

    def all_prompts(self) -> Iterator[Prompt]:
        """Every prompt once, in file order, without moving the cursor (evaluation)."""
        for index in range(len(self._rows)):
            yield self._prompt(index, 0)

    def _prompt(self, index: int, epoch: int) -> Prompt:
        row = self._rows[index]
        # Copies: the rollout mutates samples built from these, the dataset must stay intact.
        return Prompt(
            index=index,
            epoch=epoch,
            prompt=copy.deepcopy(row.prompt),
            prompt_ids=row.prompt_ids.tolist(),
            label=row.label,
            metadata=copy.deepcopy(row.metadata),
        )

    # ----- checkpoint -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor plus what fixes the order (seed, shuffle, row count)."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_rows": len(self._rows),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved cursor. The order is rebuilt from the *saved* seed and shuffle flag,
        since a cursor means nothing in another order; a different row count means the data
        changed under the checkpoint, which would silently skip or repeat prompts: refused."""
        if state["num_rows"] != len(self._rows):
            raise ValueError(
                f"prompt data {self.path} has {len(self._rows)} usable rows but the checkpoint's cursor "
                f"was saved with {state['num_rows']}: the data changed since the checkpoint"
            )
        position = state["position"]
        if not 0 <= position < len(self._rows):
            raise ValueError(f"prompt data {self.path}: checkpoint cursor position {position} is out of range")
        if state["seed"] != self.seed or state["shuffle"] != self.shuffle:
            log.warning(
                "prompt data %s: resuming with the checkpoint's order (seed %s, shuffle %s) instead of "
                "(seed %s, shuffle %s)", self.path, state["seed"], state["shuffle"], self.seed, self.shuffle
            )
        self.seed = state["seed"]
        self.shuffle = state["shuffle"]
        self._epoch = state["epoch"]
        self._position = position
        self._order = self._epoch_order(self._epoch)


def render_prompt(tokenizer: Any, prompt: Any, *, apply_chat_template: bool,
                  chat_template_kwargs: dict[str, Any] | None = None, input_key: str = "prompt") -> str:
    """The text a prompt is tokenized from (the chat template applied when asked); BadRow says why not."""
    if not apply_chat_template:
        if not isinstance(prompt, str):
            raise BadRow(f"{input_key!r} must be a string without --apply-chat-template, got {type(prompt).__name__}")
        return prompt
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(_is_message(m) for m in prompt):
        messages = prompt
    else:
        raise BadRow(
            f"{input_key!r} must be a string or a non-empty list of "
            f"{{'role': str, 'content': str}} messages, got {_describe(prompt)}"
        )
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(chat_template_kwargs or {}))
    except Exception as error:  # noqa: BLE001 - a template error is about this row's content
        raise BadRow(f"chat template failed: {error}") from error


def prompt_dataset(config: RolloutConfig, path: str | Path, tokenizer: Any, *, shuffle: bool,
                   num_epoch: int | None) -> PromptDataset:
    """A PromptDataset read the way the rollout section says (keys, chat template, context length).

    Rows need a label unless a custom reward function scores them: it gets the whole row (its
    label may be None) and may need none; the built-in rewards compare against the label.
    """
    return PromptDataset(path, tokenizer=tokenizer, input_key=config.input_key, label_key=config.label_key,
                         metadata_key=config.metadata_key, apply_chat_template=config.apply_chat_template,
                         apply_chat_template_kwargs=config.apply_chat_template_kwargs,
                         max_context_len=config.rollout_max_context_len,
                         require_label=not config.custom_rm_path and config.rm_type != "none",
                         shuffle=shuffle, seed=config.rollout_seed, num_epoch=num_epoch)


def eval_datasets(config: RolloutConfig, tokenizer: Any) -> dict[str, PromptDataset] | None:
    """``{name: dataset}`` of --eval-prompt-data (name "" for a single PATH), None without it."""
    sets = config.eval_sets()
    if not sets:
        return None
    return {name: prompt_dataset(config, path, tokenizer, shuffle=False, num_epoch=1) for name, path in sets.items()}


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)} items" if value else "an empty list"
    return type(value).__name__
