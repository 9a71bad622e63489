"""Recorded model turns of one session, and the training Samples they become.

The router's HTTP front records every request of a session token-exactly: the prompt ids it
sent to an engine and, per choice, the ids, logprobs and weight versions the engine returned.
A turn either extends an earlier turn — its prompt is that turn's prompt + one choice's
completion + ``new_ids`` (chat-template glue, tool results, the next user message) — or starts
afresh, when its prompt is not such an extension (a chat template that re-renders history
differently, e.g. dropping earlier reasoning). ``to_samples`` turns the record into Samples:
model tokens trainable (loss_mask 1) with their logprobs and versions, everything else
loss_mask 0; each fresh start begins a separate Sample. Text is never re-tokenized.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from slime_async.sample import Sample, Status, policy_version


@dataclass
class RecordedChoice:
    output_ids: list[int]
    logprobs: list[float]
    weight_versions: list[str | None]  # one per token
    finish_type: str  # stop | length
    # R3: the turn's routed experts, [prompt + output - 1, MoE layers, top-k] (None: not asked for)
    routed_experts: Any = field(default=None, compare=False, repr=False)


@dataclass
class RecordedTurn:
    parent: tuple[int, int] | None  # (turn, choice) this prompt extends, or None
    new_ids: list[int]  # prompt ids after the parent's prompt + completion (the whole prompt if no parent)
    choices: list[RecordedChoice]


def prompt_ids(turns: list[RecordedTurn], index: int) -> list[int]:
    """The full prompt of ``turns[index]``, rebuilt along its chain of parents."""
    pieces: list[list[int]] = []
    turn: RecordedTurn | None = turns[index]
    while turn is not None:
        pieces.append(turn.new_ids)
        if turn.parent is None:
            break
        parent_turn, parent_choice = turn.parent
        pieces.append(turns[parent_turn].choices[parent_choice].output_ids)
        turn = turns[parent_turn]
    return [token for piece in reversed(pieces) for token in piece]


def to_samples(turns: list[RecordedTurn], sample: Sample) -> list[Sample]:
    """The trajectory of ``turns`` as training Samples, ``sample`` (reused) first.

    A turn continues the Sample whose last completion its prompt extends; a turn that extends
    none starts a new Sample (``metadata["trajectory_part"]`` numbers them). Of a turn with
    several choices, the one a later turn continues is kept (choice 0 if none is).
    """
    if not turns:
        raise ValueError("no turns were recorded for this trajectory")
    continued = {turn.parent for turn in turns if turn.parent is not None}
    open_pieces: dict[tuple[int, int], Sample] = {}  # the (turn, choice) a piece ends with -> piece
    pieces: list[Sample] = []
    for index, turn in enumerate(turns):
        kept = next((c for c in range(len(turn.choices)) if (index, c) in continued), 0)
        piece = open_pieces.pop(turn.parent, None) if turn.parent is not None else None
        if piece is not None:
            piece.append_observation(turn.new_ids)
        else:
            piece = _fresh_piece(sample, prompt_ids(turns, index), first=not pieces)
            pieces.append(piece)
        _append_choice(piece, turn.choices[kept])
        open_pieces[(index, kept)] = piece
    for part, piece in enumerate(pieces):
        piece.metadata["trajectory_part"] = part
        piece.metadata["trajectory_parts"] = len(pieces)
    return pieces


def _fresh_piece(sample: Sample, prompt: list[int], first: bool) -> Sample:
    piece = sample if first else copy.deepcopy(sample)
    piece.tokens = list(prompt)
    piece.response_length = 0
    piece.loss_mask, piece.rollout_logprobs, piece.token_versions = [], [], []
    piece.rollout_routed_experts = None
    piece.status = Status.PENDING
    return piece


def _append_choice(piece: Sample, choice: RecordedChoice) -> None:
    """Model tokens, one run per weight version (a resumed turn spans several)."""
    start = 0
    ids, versions = choice.output_ids, choice.weight_versions
    for end in range(1, len(ids) + 1):
        if end == len(ids) or versions[end] != versions[start]:
            piece.append_generated(ids[start:end], choice.logprobs[start:end], policy_version(versions[start]))
            start = end
    piece.status = Status.TRUNCATED if choice.finish_type == "length" else Status.COMPLETED
    if choice.routed_experts is not None:  # its request's input was the whole piece so far: they cover it
        piece.rollout_routed_experts = choice.routed_experts

