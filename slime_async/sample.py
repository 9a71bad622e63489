"""The unit of rollout data: one trajectory, token in / token out.

``tokens`` holds prompt + response ids. Everything per response token (``loss_mask``,
``rollout_logprobs``, ``token_versions``) has length ``response_length``. A multi-turn hook
appends model turns (loss_mask 1, with logprobs and versions) and tool/environment turns
(loss_mask 0, logprob 0, version of the turn before) by token ids; text is never re-tokenized.

The same class answers to slime's names, so a plug-in written for slime's ``Sample`` runs
unchanged (``slime_async.compat.slime.utils.types.Sample`` is this class):

- ``Sample.Status.COMPLETED`` ... (``Status`` is also a class attribute), ``rollout_log_probs``
  (an alias of ``rollout_logprobs``; ``None`` reads back as ``[]``), ``weight_versions`` (the
  engines' version string per finished turn), ``append_response_tokens(...)``,
  ``effective_response_length``, ``get_reward_value(args)``;
- slime fields this runtime has no use for (``multimodal_inputs``, ``rollout_top_p_token_ids``,
  ``remove_sample``...) read as slime's defaults until set;
- any other attribute a plug-in sets (``sample.tool_call_count = 3``) is stored in
  ``metadata`` under its name and reads back as an attribute, so it travels with the sample
  into checkpoints and dumps (which serialise ``to_dict()``; values must be JSON-serialisable).
"""

from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from slime_async import routed_experts


class Status(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"  # the engine stopped on a stop token
    TRUNCATED = "truncated"  # hit max_new_tokens / the context
    ABORTED = "aborted"  # interrupted (weight update); resumable, never restarted from scratch
    FAILED = "failed"  # engine or reward error; counted, not trained unless the policy says so


# slime's finish_reason.type -> status (SGLang's meta_info).
_FINISH_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}

# slime Sample fields without a use here: read as slime's defaults until a plug-in sets them.
_SLIME_DEFAULTS: dict[str, Any] = {
    "rollout_id": None,
    "multimodal_inputs": None,
    "multimodal_train_inputs": None,
    "multimodal_train_input_id": None,
    "apply_chat_template_kwargs": {},
    "rollout_top_p_token_ids": None,
    "rollout_top_p_token_offsets": None,
    "remove_sample": False,
    "generate_function_path": None,
    "custom_rm_path": None,
    "train_metadata": None,
    "non_generation_time": 0.0,
}


def policy_version(weight_version: Any) -> int:
    """The policy version an engine reports; SGLang starts at "default", which is version 0."""
    try:
        return int(weight_version)
    except (TypeError, ValueError):
        return 0


@dataclass
class Sample:
    # Defaults everywhere (as in slime) so a plug-in can build a sample by keyword; the rollout
    # always sets the ids.
    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
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
    weight_versions: list[str] = field(default_factory=list)  # slime's: engine version per finished turn
    # On-policy distillation: the teacher engine's logprob of every response token (0.0 where
    # loss_mask is 0), scored once the sample is final; None until then, or if it could not be.
    teacher_logprobs: list[float] | None = None
    # Rollout routing replay (MoE): the experts the engine's forward used, numpy int32
    # [len(tokens) - 1, num_moe_layers, top_k] (slime_async/routed_experts.py); None unless asked for.
    rollout_routed_experts: Any = field(default=None, compare=False)

    Status: ClassVar[type[Status]] = Status  # slime's spelling: Sample.Status.COMPLETED

    # ----- slime's attribute protocol -------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIELD_NAMES or hasattr(type(self), name):
            object.__setattr__(self, name, value)  # fields, and properties through their setters
        else:
            self.metadata[name] = value  # an attribute slime plug-ins invent: kept, and checkpointed

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup failed: a plug-in's own attribute, or a slime default.
        if name.startswith("__") or name == "metadata":
            raise AttributeError(name)
        metadata = self.__dict__.get("metadata")
        if metadata is not None and name in metadata:
            return metadata[name]
        if name in _SLIME_DEFAULTS:
            return copy.copy(_SLIME_DEFAULTS[name])
        raise AttributeError(f"'Sample' object has no attribute {name!r}")

    @property
    def teacher_log_probs(self) -> list[float] | None:
        """slime's name of ``teacher_logprobs``."""
        return self.teacher_logprobs

    @teacher_log_probs.setter
    def teacher_log_probs(self, value: Any) -> None:
        self.teacher_logprobs = None if value is None else [float(v) for v in _plain_list(value)]

    @property
    def rollout_log_probs(self) -> list[float]:
        """slime's name of ``rollout_logprobs``."""
        return self.rollout_logprobs

    @rollout_log_probs.setter
    def rollout_log_probs(self, value: list[float] | None) -> None:
        self.rollout_logprobs = [] if value is None else [float(v) for v in value]

    @property
    def effective_response_length(self) -> int:
        return sum(self.loss_mask)

    def get_reward_value(self, args: Any = None) -> float:
        """slime's accessor; the reward is always the scalar here (``--reward-key`` is applied when it is scored)."""
        return self.reward

    # ----- token bookkeeping ---------------------------------------------------------------------
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

    def append_response_tokens(self, args: Any = None, *, tokens: Any = None, log_probs: Any = None,
                               trainable: bool = True, meta_info: dict[str, Any] | None = None,
                               text: str | None = None, update_terminal_info: bool = True) -> None:
        """slime's way to add a turn: model tokens (``trainable``, with the engine's ``log_probs``
        and ``meta_info``) or tool / environment tokens (``trainable=False``, no logprobs).

        ``meta_info`` is SGLang's: its ``weight_version`` becomes the tokens' policy version (else
        the sample's last one, or 0), and with ``update_terminal_info`` its ``finish_reason`` sets
        the status and the version is recorded in ``weight_versions``. ``text`` is appended to
        ``response``. ``args`` is accepted for slime's signature and not used.
        """
        tokens = _int_list(tokens)
        log_probs = None if log_probs is None else [float(v) for v in _plain_list(log_probs)]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities")
        if tokens and not trainable and log_probs is not None:
            raise ValueError("non-trainable response tokens should not pass rollout log probabilities")
        meta_info = meta_info or {}
        if text is not None:
            self.response += text
        if trainable:
            version = self.token_versions[-1] if self.token_versions else 0
            if "weight_version" in meta_info:
                version = policy_version(meta_info["weight_version"])
            self.append_generated(tokens, log_probs or [], version)
        else:
            self.append_observation(tokens)
        if update_terminal_info and "finish_reason" in meta_info:
            if "weight_version" in meta_info:
                self.weight_versions.append(str(meta_info["weight_version"]))
            finish = (meta_info["finish_reason"] or {}).get("type")
            if finish in _FINISH_STATUS:
                self.status = _FINISH_STATUS[finish]

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
        data["rollout_routed_experts"] = routed_experts.to_jsonable(self.rollout_routed_experts)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        data = dict(data)
        data["status"] = Status(data.get("status", "pending"))
        data["rollout_routed_experts"] = routed_experts.from_jsonable(data.get("rollout_routed_experts"))
        # Keys that are not fields (a dump written by slime, or a newer version) go to metadata.
        extra = {k: data.pop(k) for k in list(data) if k not in _FIELD_NAMES}
        sample = cls(**data)
        sample.metadata.update(extra)
        return sample


_FIELD_NAMES = frozenset(f.name for f in fields(Sample))


def _plain_list(values: Any) -> list[Any]:
    # Plug-ins may hand torch tensors or numpy arrays; the sample keeps plain lists.
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _int_list(tokens: Any) -> list[int]:
    return [] if tokens is None else [int(t) for t in _plain_list(tokens)]
