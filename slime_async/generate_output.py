"""What one `/generate` call answers, reduced to what the runtime uses.

`parse_generate_output` turns SGLang's answer dict (or the CPU engine's, which has the same
shape) into a `GenerateOutput`; the HTTP transport is slime_async/engine_client.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class GenerateOutput:
    """One completed (or aborted) generation, reduced to what the runtime uses.

    `output_ids` and `logprobs` always have the same length when logprobs were requested:
    the ids are taken from `meta_info.output_token_logprobs` when present, because that list
    pairs every sampled token (including a matched stop token, which SGLang may trim from
    `output_ids`) with its logprob, which is what training needs.
    """

    output_ids: list[int]
    logprobs: list[float] | None
    finish_type: str  # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    weight_version: str | None
    finish_reason: dict[str, Any] | None = None
    text: str | None = None
    # Each output token's weight version, when the answer says (meta_info
    # ``weight_version_segments``: the CPU engine, or the router for a request that spanned an
    # in-place sync); None: all of them are ``weight_version``.
    token_versions: list[str] | None = None


def parse_generate_output(data: dict[str, Any]) -> GenerateOutput:
    """Turn one `/generate` answer into a `GenerateOutput`.

    Raises ValueError (with the keys that were present) when the answer has neither
    `output_ids` nor `meta_info.output_token_logprobs`, unless it is an abort (then: no tokens).
    """
    meta = data.get("meta_info") or {}
    finish_reason = meta.get("finish_reason")
    if isinstance(finish_reason, dict):
        finish_type = str(finish_reason.get("type", ""))
    else:
        finish_type = str(finish_reason or "")
    token_logprobs = meta.get("output_token_logprobs")
    if token_logprobs is not None:
        # Each entry is [logprob, token_id, token_text_or_null].
        output_ids = [int(entry[1]) for entry in token_logprobs]
        logprobs: list[float] | None = [float(entry[0]) for entry in token_logprobs]
    elif "output_ids" in data:
        output_ids = [int(t) for t in data["output_ids"]]
        logprobs = None
    elif finish_type == "abort":
        # SGLang answers a request aborted while still queued ("Abort before prefill") without
        # either field: it produced nothing, which is a valid partial result to resume from.
        output_ids, logprobs = [], []
    else:
        raise ValueError(
            "generate answer has neither output_ids nor meta_info.output_token_logprobs "
            f"(keys: {sorted(data)}, meta_info keys: {sorted(meta)})"
        )
    weight_version = meta.get("weight_version")
    token_versions = _token_versions(meta.get("weight_version_segments"), len(output_ids))
    return GenerateOutput(
        output_ids=output_ids,
        logprobs=logprobs,
        finish_type=finish_type,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        completion_tokens=int(meta.get("completion_tokens", len(output_ids))),
        cached_tokens=int(meta.get("cached_tokens", 0)),
        weight_version=None if weight_version is None else str(weight_version),
        finish_reason=finish_reason if isinstance(finish_reason, dict) else None,
        text=data.get("text"),
        token_versions=token_versions,
    )


def _token_versions(segments: Any, n_tokens: int) -> list[str] | None:
    """``[[version, n], ...]`` expanded to one version per output token; None when absent."""
    if segments is None:
        return None
    try:
        versions = [str(version) for version, count in segments for _ in range(int(count))]
    except (TypeError, ValueError):
        raise ValueError(f"meta_info.weight_version_segments must be [[version, n_tokens], ...], got {segments!r:.200}")
    if len(versions) != n_tokens:
        raise ValueError(f"meta_info.weight_version_segments covers {len(versions)} tokens, the answer has {n_tokens}")
    return versions
