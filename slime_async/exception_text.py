"""The exception a failure is about, cut to what a user reads: its type and message, its innermost
frames, and the innermost frame in the user's or the project's own code.

Two sources, one shape:
- a child process's log (``log_exception``): the last Python traceback it printed — a torchrun
  rank's (torchrun's ``@record`` summary first, then the ``[rankN]:``-prefixed lines, never
  torchrun's own ``ChildFailedError``), an SGLang server's (the traceback a scheduler, detokenizer
  or data-parallel controller logs as "<Process> hit an exception: Traceback ...", before the
  launcher's own ``EOFError``), or a CPU engine's; chained exceptions keep the chain's root cause;
- a live exception (``describe``): one line, for a hook that raised mid-run.
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass
from pathlib import Path

TRACEBACK = "Traceback (most recent call last):"
_CHAIN_SEPARATORS = ("The above exception was the direct cause of the following exception:",
                     "During handling of the above exception, another exception occurred:")
# ProcessChild writes this line each time it starts the process; the log is appended across restarts.
_START_MARKER = re.compile(r"^=== \d{4}-\d\d-\d\d \d\d:\d\d:\d\d start: ", re.MULTILINE)
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]: ?", re.MULTILINE)
# SGLang's subprocesses log their death as "[time TP0] Scheduler hit an exception: Traceback ...".
_REPORTED = re.compile(r"\bhit an exception: ")
# torchrun's summary with @record: "  traceback : Traceback ..." then the rank's traceback, indented by 2.
_RECORDED = re.compile(r"Root Cause \(first observed failure\):.*?^  traceback : (Traceback \(most recent call "
                       r"last\):.*?)^=+$", re.DOTALL | re.MULTILINE)
# A line that starts a new log record, not a continuation of an exception's message.
_RECORD_START = re.compile(r"^(\[\d{4}-|\[rank \d|\d{4}-\d\d-\d\d[ T]|[EWIF]\d{4} |=== |Traceback )")
_FRAME = re.compile(r'^  File "([^"]+)", line (\d+), in (.+)$')
# Library code (here or on another host): installed packages, the standard library, frozen modules.
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<")
_MAX_MESSAGE_LINES = 8
WINDOW_BYTES = 256 * 1024


def log_window(path: Path, max_bytes: int = WINDOW_BYTES) -> str:
    """The end of a child's log (at most ``max_bytes``), from the latest start of the process on."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    starts = list(_START_MARKER.finditer(text))
    return text[starts[-1].start():] if starts else text


def exception_section(who: str, exception: str) -> str:
    """The end of a failure's message that shows ``who``'s own exception ("" when there is none)."""
    return f"{who}'s exception:\n{exception}" if exception else ""


def child_exception(error: BaseException | None) -> str:
    """The ``child_exception`` section of ``error`` or of an error it wraps (a supervisor's
    ``error``, an actor failure's, a ``__cause__``): what the console shows last."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if getattr(error, "child_exception", ""):
            return error.child_exception
        error = getattr(error, "error", None) or error.__cause__
    return ""


def log_exception(text: str, frames: int = 3) -> str:
    """The exception a process died of, from its log's ``text``: a traceback cut to its innermost
    ``frames`` frames (and the innermost one in own code, when those are all in libraries) and its
    exception line(s); for a chain, the root cause's innermost frame and line first. "" when the
    log holds no traceback (a process killed by a signal)."""
    text = _RANK_PREFIX.sub("", text)
    recorded = _RECORDED.search(text)
    if recorded:  # the rank's own traceback, written by @record and printed whole by torchrun
        text = "\n".join(line[2:] if line.startswith("  ") else line
                         for line in recorded.group(1).splitlines())
    # torchrun's own ChildFailedError is a summary of a rank's failure, not the failure itself.
    chains = [chain for chain in _chains(text) if "ChildFailedError" not in chain[-1].message[0]]
    if not chains:
        return ""
    # SGLang: the scheduler's exception, not the launcher's EOFError on the pipe it left behind.
    chain = ([c for c in chains if c[0].reported] or chains)[-1]
    last = chain[-1]
    text = "\n".join([TRACEBACK, *_cut(last.frames, frames), *last.message])
    if len(chain) > 1:  # the chain's root cause first, as Python prints it
        root = chain[0]
        text = "\n".join([TRACEBACK, *_cut(root.frames, 1), *root.message, "", last.separator, "", text])
    return text


@dataclass
class _Traceback:
    reported: bool  # logged as "<Process> hit an exception: Traceback ..."
    frames: list[str]  # the '  File ...' lines and the code under them
    message: list[str]  # 'ValueError: ...' and the message's further lines
    separator: str  # how it follows the previous traceback of its chain ("" when it starts one)


def _chains(text: str) -> list[list[_Traceback]]:
    """Every traceback in ``text``, grouped into chains (a cause, then the exceptions it led to)."""
    lines = text.splitlines()
    chains: list[list[_Traceback]] = []
    separator = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        at = line.find(TRACEBACK)
        if at < 0:
            if line.strip() in _CHAIN_SEPARATORS:
                separator = line.strip()
            elif line.strip():
                separator = ""  # any other line ends a chain
            index += 1
            continue
        frames, index = _take(lines, index + 1, lambda s: s.startswith(" "))
        message, index = _take(lines, index, lambda s: bool(s.strip()) and not _RECORD_START.match(s),
                               _MAX_MESSAGE_LINES)
        if not frames or not message:
            separator = ""
            continue
        block = _Traceback(bool(_REPORTED.search(line[:at])), frames, message, separator)
        if separator and chains:
            chains[-1].append(block)
        else:
            chains.append([block])
        separator = ""
    return chains


def _take(lines: list[str], start: int, keep, limit: int | None = None) -> tuple[list[str], int]:
    end = start
    while end < len(lines) and keep(lines[end]) and (limit is None or end - start < limit):
        end += 1
    return lines[start:end], end


def _cut(frame_lines: list[str], keep: int) -> list[str]:
    """The innermost ``keep`` frames; when all of them are library code, the innermost frame in
    own code (the user's or the project's) before them, after an ellipsis."""
    starts = [i for i, line in enumerate(frame_lines) if _FRAME.match(line)]
    if not starts:
        return frame_lines[-2 * keep:]
    bounds = list(zip(starts, starts[1:] + [len(frame_lines)]))
    kept = bounds[-keep:]
    if all(_is_library(frame_lines[s]) for s, _ in kept):
        own = [(s, e) for s, e in bounds[:-keep] if not _is_library(frame_lines[s])]
        if own:
            s, e = own[-1]
            return [*frame_lines[s:e], "  ...", *frame_lines[kept[0][0]:]]
    return frame_lines[kept[0][0]:]


def _is_library(frame_line: str) -> bool:
    match = _FRAME.match(frame_line)
    return bool(match and _LIBRARY.search(match.group(1)))


def describe(error: BaseException) -> str:
    """One line for a live exception: ``Type: message (at file:line in function)``, the frame
    being the innermost in own code (the user's hook, say) or else the innermost; an exception
    raised from another ends with its root cause, described the same way."""
    text = _one(error)
    root = error
    seen = {id(error)}
    while True:
        cause = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
        if cause is None or id(cause) in seen:
            break
        seen.add(id(cause))
        root = cause
    return text if root is error else f"{text}; caused by {_one(root)}"


def _one(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    if isinstance(error, SyntaxError) and error.filename:  # where the bad code is, not who compiled it
        return f"{text} (at {error.filename}:{error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not _LIBRARY.search(frame.filename)]
    frame = (own or frames or [None])[-1]
    return text if frame is None else f"{text} (at {frame.filename}:{frame.lineno} in {frame.name})"


