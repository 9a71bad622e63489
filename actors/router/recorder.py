"""Per-session record of what the front generated, token-exact, and bounded.

For each turn the recorder keeps the prompt ids sent to the engines and every choice's ids,
logprobs and weight versions (as ``slime_async.trajectory.RecordedTurn``). Storage is a chain: a
turn that extends an earlier turn's prompt + completion stores only the ids (and chat text)
after it, so a long multi-turn session costs memory linear in its length, not quadratic.

For chat requests it also answers ``text_prefix``: the longest recorded prompt + completion
whose text the new rendered prompt starts with. The front then reuses those exact ids and
tokenizes only the rest, so a new turn extends the previous one token-exactly whenever the
chat template renders history the way the model wrote it.

Stored as tuples, handed back as lists: a list of token ids is a container the garbage
collector walks at every full collection, element by element (each int object read from
memory), and a thousand recorded sessions are about a million ids: ~115 ms per full collection,
with the event loop stopped. A tuple of ints is untracked by the collector the first time it
sees it, so recorded turns cost it nothing (docs/agents.md "The front under load").

Bounded: at most ``max_sessions`` sessions (the least recently used is forgotten beyond that)
and ``max_turns`` turns per session; a collected session is forgotten.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field, replace

from slime_async.trajectory import RecordedChoice, RecordedTurn, prompt_ids

log = logging.getLogger(__name__)

EVICTED_NAMES_KEPT = 4096  # to tell "evicted" from "never recorded" in errors


class TrajectoryError(LookupError):
    """A session the recorder cannot hand back; the message says why and which flag to change."""


@dataclass
class _TurnText:
    parent: tuple[int, int] | None  # text chain, like the ids
    new_text: str
    choice_texts: list[str]  # each completion decoded with its special tokens


@dataclass
class _Session:
    turns: list[RecordedTurn] = field(default_factory=list)
    texts: list[_TurnText | None] = field(default_factory=list)
    overflowed: bool = False


class SessionRecorder:
    def __init__(self, max_sessions: int, max_turns: int):
        self.max_sessions = max_sessions
        self.max_turns = max_turns
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self.evictions = 0  # sessions forgotten before anyone collected them

    @property
    def enabled(self) -> bool:
        return self.max_sessions > 0

    def __len__(self) -> int:
        return len(self._sessions)

    def text_prefix(self, session_id: str, text: str) -> tuple[tuple[int, int], int, list[int]] | None:
        """``((turn, choice), chars, ids)`` of the longest recorded prompt + completion whose text
        ``text`` starts with, or None."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        best: tuple[tuple[int, int], int] | None = None
        for index in range(len(session.turns) - 1, -1, -1):
            if session.texts[index] is None:
                continue
            prompt_text = self._full_text(session, index)
            if not text.startswith(prompt_text):
                continue
            for choice, completion_text in enumerate(session.texts[index].choice_texts):
                size = len(prompt_text) + len(completion_text)
                if (best is None or size > best[1]) and text.startswith(completion_text, len(prompt_text)):
                    best = ((index, choice), size)
        if best is None:
            return None
        (index, choice), size = best
        return (index, choice), size, prompt_ids(session.turns, index) + list(session.turns[index].choices[choice].output_ids)

    def record(self, session_id: str, prompt: list[int], choices: list[RecordedChoice], *,
               text: str | None = None, choice_texts: list[str] | None = None,
               text_parent: tuple[tuple[int, int], int] | None = None) -> None:
        """Add one turn. ``text_parent`` is ``((turn, choice), chars)`` from ``text_prefix`` when
        the prompt was built on it; otherwise the parent is the longest recorded prompt +
        completion that ``prompt`` extends token by token."""
        if not self.enabled:
            return
        session = self._session(session_id)
        if len(session.turns) >= self.max_turns:
            session.overflowed = True
            return
        parent, covered = self._token_parent(session, prompt)
        turn_text = None
        if text is not None:
            if text_parent is not None and text_parent[0] == parent:
                turn_text = _TurnText(parent, text[text_parent[1]:], list(choice_texts or []))
            else:
                turn_text = _TurnText(None, text, list(choice_texts or []))
        session.turns.append(RecordedTurn(parent, tuple(prompt[covered:]), [_frozen(c) for c in choices]))
        session.texts.append(turn_text)

    def take(self, session_id: str) -> list[RecordedTurn]:
        """The session's turns, in order; the session is forgotten."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            if session_id in self._evicted:
                raise TrajectoryError(
                    f"session {session_id!r} was forgotten: more than {self.max_sessions} sessions were recorded "
                    "since it started (--router-max-recorded-sessions)")
            raise TrajectoryError(f"no requests were recorded for session {session_id!r} (was the agent given the "
                                  "session's base URL, ctx.openai_base_url(sample)?)")
        if session.overflowed:
            raise TrajectoryError(f"session {session_id!r} had more than {self.max_turns} turns "
                                  "(--router-max-recorded-turns)")
        return [RecordedTurn(t.parent, list(t.new_ids), [_thawed(c) for c in t.choices]) for t in session.turns]

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    # ----- internals -------------------------------------------------------------------------
    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is not None:
            self._sessions.move_to_end(session_id)
            return session
        session = self._sessions[session_id] = _Session()
        while len(self._sessions) > self.max_sessions:
            evicted, _ = self._sessions.popitem(last=False)
            self.evictions += 1
            log.debug("recorder: forgot session %s (--router-max-recorded-sessions %d)", evicted, self.max_sessions)
            self._evicted[evicted] = None
            if len(self._evicted) > EVICTED_NAMES_KEPT:
                self._evicted.popitem(last=False)
        return session

    @staticmethod
    def _token_parent(session: _Session, prompt: list[int]) -> tuple[tuple[int, int] | None, int]:
        """The longest recorded prompt + completion that ``prompt`` starts with, and its length."""
        best: tuple[int, int] | None = None
        covered = 0
        for index in range(len(session.turns)):
            turn_prompt = prompt_ids(session.turns, index)
            if len(turn_prompt) > len(prompt) or prompt[:len(turn_prompt)] != turn_prompt:
                continue
            for choice, recorded in enumerate(session.turns[index].choices):
                size = len(turn_prompt) + len(recorded.output_ids)
                if size > covered and size <= len(prompt) and tuple(prompt[len(turn_prompt):size]) == recorded.output_ids:
                    best, covered = (index, choice), size
        return best, covered

    @staticmethod
    def _full_text(session: _Session, index: int) -> str:
        pieces: list[str] = []
        text = session.texts[index]
        while text is not None:
            pieces.append(text.new_text)
            if text.parent is None:
                break
            parent_turn, parent_choice = text.parent
            parent = session.texts[parent_turn]
            pieces.append(parent.choice_texts[parent_choice])
            text = parent
        return "".join(reversed(pieces))


def _frozen(choice: RecordedChoice) -> RecordedChoice:
    """Kept as tuples (see the module docstring)."""
    return replace(choice, output_ids=tuple(choice.output_ids), logprobs=tuple(choice.logprobs),  # type: ignore[arg-type]
                   weight_versions=tuple(choice.weight_versions))  # type: ignore[arg-type]


def _thawed(choice: RecordedChoice) -> RecordedChoice:
    return replace(choice, output_ids=list(choice.output_ids), logprobs=list(choice.logprobs),
                   weight_versions=list(choice.weight_versions))
