"""The unit of rollout data: one trajectory, token in / token out.

``tokens`` holds prompt + response ids. Everything per response token (``loss_mask``,
``rollout_logprobs``, ``token_versions``) has length ``response_length``. A multi-turn hook
appends model turns (loss_mask 1, with logprobs and versions) and tool/environment turns
(loss_mask 0, logprob 0, version of the turn before) by token ids; text is never re-tokenized.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"  # the engine stopped on a stop token
    TRUNCATED = "truncated"  # hit max_new_tokens / the context
    ABORTED = "aborted"  # interrupted (weight update); resumable, never restarted from scratch
    FAILED = "failed"  # engine or reward error; counted, not trained unless the policy says so


@dataclass
class Sample:
    group_index: int
    index: int
    prompt: str | list[dict[str, Any]]
    tokens: list[int]
    response_length: int = 0
    label: Any = None
    session_id: str | None = None
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    response: str = ""
    reward: float | None = None
    status: Status = Status.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def prompt_tokens(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def append_generated(self, token_ids: list[int], logprobs: list[float], version: int) -> None:
        """Append model-generated tokens (trainable) produced by policy ``version``."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} tokens but {len(logprobs)} logprobs")
        self.tokens.extend(token_ids)
        self.response_length += len(token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.rollout_logprobs.extend(logprobs)
        self.token_versions.extend([version] * len(token_ids))

    def append_observation(self, token_ids: list[int]) -> None:
        """Append tokens the model did not generate (tool output, user turn): never trained."""
        version = self.token_versions[-1] if self.token_versions else -1
        self.tokens.extend(token_ids)
        self.response_length += len(token_ids)
        self.loss_mask.extend([0] * len(token_ids))
        self.rollout_logprobs.extend([0.0] * len(token_ids))
        self.token_versions.extend([version] * len(token_ids))

    def oldest_version(self) -> int | None:
        """The oldest policy version among generated tokens (None when nothing was generated)."""
        generated = [v for v, m in zip(self.token_versions, self.loss_mask) if m]
        return min(generated) if generated else None

    def check(self) -> None:
        """Raise ValueError if the per-token lists disagree with ``response_length``."""
        n = self.response_length
        for name in ("loss_mask", "rollout_logprobs", "token_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"sample {self.group_index}/{self.index}: {name} has {len(getattr(self, name))} "
                    f"entries for response_length {n}"
                )
        if n > len(self.tokens):
            raise ValueError(f"sample {self.group_index}/{self.index}: response_length {n} > {len(self.tokens)} tokens")

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        data = dict(data)
        data["status"] = Status(data.get("status", "pending"))
        return cls(**data)
