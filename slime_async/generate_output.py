"""What one `/generate` call answers, reduced to what the runtime uses.

`parse_generate_output` turns SGLang's answer dict (or the CPU engine's, which has the same
shape) into a `GenerateOutput`; `StreamAssembler` builds that answer dict from the chunks of a
streamed call (`stream: true`, server-sent events, `SSEDecoder`). The HTTP transport is
slime_async/engine_client.py.

SGLang 0.5.17's stream (entrypoints/http_server.py ``generate_request``; the chunks are built in
managers/tokenizer_manager.py ``_handle_batch_output``):
- framing: ``data: <json>\n\n`` per chunk, then ``data: [DONE]\n\n``; an error raised while
  streaming comes as one more chunk ``{"error": {"message", "type", "code"}}`` before ``[DONE]``
  (the HTTP status is already 200);
- by default (``--incremental-streaming-output`` off) every chunk is cumulative: ``output_ids``,
  ``text`` and ``meta_info.output_token_logprobs`` hold everything generated so far; with it on
  they hold only the chunk's new tokens. ``meta_info.completion_tokens`` counts all tokens so far
  in both modes, which is how `StreamAssembler` tells them apart;
- chunks the HTTP writer has not sent yet are coalesced (``_wait_one_response`` yields only the
  last one, cumulative mode), so one chunk may bring several new tokens;
- ``meta_info.weight_version`` is the engine's version when the chunk was built, and
  ``finish_reason`` is null until the last chunk; an abort (``/abort_request``, a pause in mode
  abort) ends the stream with a chunk whose finish_reason is abort and that has the tokens so far;
  an abort with status_code 400, 500 or 503 is what the non-streamed call answers with an HTTP error.
- a request aborted in the waiting queue ends with ``output_ids`` holding only the last token
  (``_handle_abort_req``), whatever the mode: its completion_tokens says nothing is new.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Finish reasons of an abort that SGLang's non-streamed /generate answers with this HTTP status
# (tokenizer_manager ``_handle_abort_finish_reason``): the request failed, nothing to resume from.
FAILED_ABORT_STATUS = (400, 500, 503)


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
    # Per output token its most likely alternatives as (logprob, token id), most likely first,
    # when the request asked for them (``top_logprobs_num``, meta_info ``output_top_logprobs``).
    top_logprobs: list[list[tuple[float, int]]] | None = None


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
    top_logprobs = _top_logprobs(meta.get("output_top_logprobs"), len(output_ids))
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
        top_logprobs=top_logprobs,
    )


def _top_logprobs(entries: Any, n_tokens: int) -> list[list[tuple[float, int]]] | None:
    """SGLang's ``output_top_logprobs`` (per token a list of [logprob, token_id, text], or null when
    it has none) as (logprob, token id) pairs; None when absent."""
    if entries is None:
        return None
    try:
        tops = [[(float(entry[0]), int(entry[1])) for entry in position or ()] for position in entries]
    except (TypeError, ValueError, IndexError):
        raise ValueError(f"meta_info.output_top_logprobs must be [[[logprob, token_id, text], ...], ...], "
                         f"got {entries!r:.200}") from None
    if len(tops) != n_tokens:
        raise ValueError(f"meta_info.output_top_logprobs covers {len(tops)} tokens, the answer has {n_tokens}")
    return tops


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


def segments_of(versions: list[str]) -> list[list[Any]]:
    """One version per token -> ``[[version, n], ...]`` (the runs, in order)."""
    segments: list[list[Any]] = []
    for version in versions:
        if segments and segments[-1][0] == version:
            segments[-1][1] += 1
        else:
            segments.append([version, 1])
    return segments


# --------------------------------------------------------------------------------------
# Streamed answers


class SSEDecoder:
    """Server-sent events to their data: ``feed`` bytes as they arrive, get each complete
    event's data (its ``data:`` lines joined by newlines). Other fields are ignored."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        events: list[bytes] = []
        start = 0
        while (end := self._buffer.find(b"\n", start)) >= 0:
            line = bytes(self._buffer[start:end]).rstrip(b"\r")
            start = end + 1
            if not line:  # a blank line ends the event
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        del self._buffer[:start]
        return events


def stream_failure(chunk: dict[str, Any]) -> tuple[int | None, str] | None:
    """``(HTTP status, message)`` when a stream chunk says the request failed (what the
    non-streamed call answers with an HTTP error status); None for a normal chunk."""
    error = chunk.get("error")
    if error is not None:
        if isinstance(error, dict):
            code = error.get("code")
            return (code if isinstance(code, int) else None), str(error.get("message", error))
        return None, str(error)
    finish = (chunk.get("meta_info") or {}).get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort" and finish.get("status_code") in FAILED_ABORT_STATUS:
        return int(finish["status_code"]), str(finish.get("message", "aborted"))
    return None


class StreamAssembler:
    """The chunks of one streamed `/generate` call -> the answer the non-streamed call returns.

    Cumulative (SGLang's default) and incremental chunks are both understood (see the module
    docstring). Each output token's weight version is the ``weight_version`` of the chunk that
    first reported it; the answer gets them as ``meta_info.weight_version_segments`` unless the
    engine reports its own (the CPU engine does; those win), and not at all when a chunk with new
    tokens names no version.

    ``version_lag``: at each version change, this many of the first tokens reported under the new
    version keep the previous one. SGLang's overlap scheduler holds the result of its last step
    before a pause in place and streams it after the update, under the new version, though the old
    weights produced it (scheduler.py ``event_loop_overlap``: the paused loop never pops
    ``result_queue``): 1 there, plus ``stream_interval - 1`` tokens it may have held back unsent.
    """

    def __init__(self, version_lag: int = 0) -> None:
        if version_lag < 0:
            raise ValueError(f"version_lag must be >= 0, got {version_lag}")
        self.version_lag = version_lag
        self.chunks = 0
        self._ids: list[int] = []
        self._logprobs: list[Any] | None = None  # [[logprob, token_id, text], ...] when the chunks have them
        self._tops: list[Any] | None = None  # output_top_logprobs, when the chunks have them
        self._text: str | None = None
        self._versions: list[str | None] = []  # one per token of the longer of the two lists
        self._last: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self._last is not None and (self._last.get("meta_info") or {}).get("finish_reason") is not None

    @property
    def tokens(self) -> int:
        return len(self._versions)

    def add(self, chunk: dict[str, Any]) -> None:
        """Take one chunk; ValueError when it does not continue the ones before it."""
        if not isinstance(chunk, dict):
            raise ValueError(f"stream chunk must be a JSON object, got {type(chunk).__name__}")
        if self.finished:
            return  # nothing follows the finished chunk but [DONE]
        meta = chunk.get("meta_info") or {}
        total = meta.get("completion_tokens")
        total = total if isinstance(total, int) and not isinstance(total, bool) else None
        new_ids, cumulative = _new_entries(chunk.get("output_ids"), len(self._ids), total, "output_ids")
        self._ids.extend(int(t) for t in new_ids)
        entries = meta.get("output_token_logprobs")
        if entries is not None:
            seen = 0 if self._logprobs is None else len(self._logprobs)
            new_logprobs, mode = _new_entries(entries, seen, total, "meta_info.output_token_logprobs")
            if self._logprobs is None:
                self._logprobs = []
            self._logprobs.extend(new_logprobs)
            cumulative = mode if mode is not None else cumulative
        tops = meta.get("output_top_logprobs")
        if tops is not None:
            seen = 0 if self._tops is None else len(self._tops)
            self._tops = (self._tops or []) + _new_entries(tops, seen, total, "meta_info.output_top_logprobs")[0]
        self._add_text(chunk.get("text"), cumulative)
        version = meta.get("weight_version")
        added = max(len(self._ids), len(self._logprobs or ())) - len(self._versions)
        self._versions.extend([None if version is None else str(version)] * added)
        self._last = chunk
        self.chunks += 1

    def _add_text(self, text: Any, cumulative: bool | None) -> None:
        if not isinstance(text, str):
            return
        if cumulative is None:  # nothing new: a full text (a queued abort's) or an empty delta
            cumulative = self._text is None or text.startswith(self._text)
        self._text = text if cumulative or self._text is None else self._text + text

    def answer(self) -> dict[str, Any]:
        """The assembled answer (call once the stream is done); ValueError when no chunk came."""
        if self._last is None:
            raise ValueError("the stream ended before its first chunk")
        answer = dict(self._last)
        meta = dict(answer.get("meta_info") or {})
        answer["output_ids"] = list(self._ids)
        if self._logprobs is not None:
            meta["output_token_logprobs"] = self._logprobs
            meta["output_token_logprobs_length"] = len(self._logprobs)
        if self._tops is not None:
            meta["output_top_logprobs"] = self._tops
        if self._text is not None:
            answer["text"] = self._text
        if "weight_version_segments" not in meta and all(v is not None for v in self._versions):
            meta["weight_version_segments"] = segments_of(_lagged(self._versions, self.version_lag))
        answer["meta_info"] = meta
        return answer


def _new_entries(entries: Any, seen: int, total: int | None, what: str) -> tuple[list[Any], bool | None]:
    """The entries a chunk adds to the ``seen`` before it, and whether it was cumulative (None:
    it added nothing, so the mode does not show). ``total``: the chunk's completion_tokens."""
    if entries is None:
        return [], None
    if not isinstance(entries, list):
        raise ValueError(f"stream chunk {what} must be a list, got {type(entries).__name__}")
    if total is None:  # no count to tell the modes apart: SGLang's default, cumulative
        if len(entries) < seen:
            raise ValueError(f"stream chunk {what} has {len(entries)} entries after {seen} were reported")
        return entries[seen:], (True if len(entries) > seen else None)
    if total == seen:
        return [], None  # nothing new (an empty delta, a repeat, or a queued abort's last token)
    if len(entries) == total and total >= seen:
        return entries[seen:], True
    if seen + len(entries) == total:
        return entries, False
    raise ValueError(f"stream chunk {what} has {len(entries)} entries and completion_tokens {total} "
                     f"after {seen} tokens: neither cumulative nor the new ones")


def _lagged(versions: list[str | None], lag: int) -> list[str | None]:
    """The first ``lag`` tokens after each version change take the version before it."""
    if lag == 0:
        return versions
    out = list(versions)
    for start in range(1, len(versions)):
        if versions[start] != versions[start - 1]:
            end = start
            while end < min(start + lag, len(versions)) and versions[end] == versions[start]:
                end += 1
            out[start:end] = [versions[start - 1]] * (end - start)
    return out
