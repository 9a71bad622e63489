"""Draw a ``--trace-dir`` timeline (Chrome trace-event JSON) as a PNG.

    python benchmarks/render_trace.py RUN/trace/trace.json -o timeline.png [--title TEXT] [--start S] [--end S]

One row per lane, top to bottom in the trace's process order: each engine (its concurrent
requests stacked as thin sub-rows, resumed ones in a lighter shade), rewards, the buffer waits,
the train loop's steps, the trainer's ops on its ranks, the weight syncs (each sync an outlined
box around its pause / transfer / resume). The x axis is seconds from the first span; each row's
label says how busy the lane was (the share of the shown window covered by a span). The file's
metadata (mode, transport) goes in the default title. Needs matplotlib only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Fill colour by span name (prefix match, first wins); other names get a neutral grey.
COLORS = (
    ("generate resumed", "#9ecae1"),
    ("generate", "#2171b5"),
    ("reward", "#41ab5d"),
    ("wait", "#bdbdbd"),
    ("step", "#fdd0a2"),
    ("train_step", "#d94801"),
    ("logprobs (ref)", "#fec44f"),
    ("logprobs", "#fe9929"),
    ("compute_values", "#fe9929"),
    ("pause", "#807dba"),
    ("transfer", "#54278f"),
    ("resume", "#bcbddc"),
    ("rejoin", "#9e9ac8"),
    ("export_hf", "#6a51a3"),
    ("broadcast_weights", "#6a51a3"),
    ("init_weight_group", "#9e9ac8"),
    ("destroy_weight_group", "#9e9ac8"),
    ("weight_metadata", "#9e9ac8"),
)
OTHER = "#969696"
LEGEND = (("generate", "generation request"), ("generate resumed", "resumed request"), ("reward", "reward"),
          ("wait", "buffer wait"), ("step", "train-loop step"), ("logprobs", "logprobs (π_old)"),
          ("logprobs (ref)", "logprobs (π_ref)"), ("train_step", "train step"), ("pause", "sync: pause"),
          ("transfer", "sync: transfer"),
          ("resume", "sync: resume"), ("export_hf", "trainer: export / broadcast"),
          ("init_weight_group", "trainer: weight group"))
MAX_SUBROWS_HEIGHT = 3.0  # a pool of many lanes (an engine's requests) takes at most this many row heights


@dataclass
class Span:
    name: str
    start: float  # seconds
    end: float
    args: dict[str, Any]


@dataclass
class Process:
    pid: int
    name: str
    order: int = 1_000
    threads: dict[int, str] = field(default_factory=dict)  # tid -> name
    thread_order: dict[int, int] = field(default_factory=dict)
    spans: dict[int, list[Span]] = field(default_factory=lambda: defaultdict(list))  # tid -> spans


def load(path: Path) -> tuple[list[Process], dict[str, Any]]:
    """The trace's processes (in their sort order) with their spans, and its ``otherData``."""
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    processes: dict[int, Process] = {}

    def process(pid: int) -> Process:
        return processes.setdefault(pid, Process(pid, f"process {pid}"))

    for event in events:
        phase, pid, tid = event.get("ph"), event.get("pid", 0), event.get("tid", 0)
        args = event.get("args") or {}
        if phase == "M":
            kind = event.get("name")
            if kind == "process_name":
                process(pid).name = str(args.get("name"))
            elif kind == "process_sort_index":
                process(pid).order = int(args.get("sort_index", 0))
            elif kind == "thread_name":
                process(pid).threads[tid] = str(args.get("name"))
            elif kind == "thread_sort_index":
                process(pid).thread_order[tid] = int(args.get("sort_index", 0))
        elif phase == "X":
            start = float(event["ts"]) / 1e6
            owner = process(pid)
            owner.threads.setdefault(tid, f"thread {tid}")
            end = start + float(event.get("dur", 0)) / 1e6
            owner.spans[tid].append(Span(str(event.get("name", "")), start, end, args))
    ordered = sorted((p for p in processes.values() if p.spans), key=lambda p: (p.order, p.pid))
    return ordered, (data.get("otherData") or {}) if isinstance(data, dict) else {}


def pool_name(thread: str) -> str:
    """The pool a thread belongs to (``TraceRecorder.pool``'s threads are "<name> 0", "<name> 1", ...),
    else its own name."""
    base, _, number = thread.rpartition(" ")
    return base if base and number.isdigit() else thread


def color(span: Span) -> str:
    name = span.name
    if name == "generate" and span.args.get("resumed"):
        name = "generate resumed"
    return next((c for prefix, c in COLORS if name.startswith(prefix)), OTHER)


def busy_fraction(spans: list[Span], start: float, end: float) -> float:
    """Share of [start, end] covered by at least one span."""
    covered, reach = 0.0, start
    for span in sorted(spans, key=lambda s: s.start):
        lo, hi = max(span.start, reach), min(span.end, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
        reach = max(reach, min(span.end, end))
    return covered / (end - start) if end > start else 0.0


def contains_others(span: Span, spans: list[Span]) -> bool:
    """Whether shorter spans of the same lane lie inside ``span`` (it is drawn as their outline)."""
    length = span.end - span.start
    return any(o is not span and span.start <= o.start and o.end <= span.end and o.end - o.start < length
               for o in spans)


def render(processes: list[Process], other: dict[str, Any], out: Path, *, title: str | None = None,
           window: tuple[float | None, float | None] = (None, None)) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    all_spans = [s for p in processes for spans in p.spans.values() for s in spans]
    if not all_spans:
        raise SystemExit("render_trace: the trace has no spans")
    origin = min(s.start for s in all_spans)
    lo = origin + (window[0] or 0.0)
    hi = origin + window[1] if window[1] is not None else max(s.end for s in all_spans)

    # Layout: a row per thread, except that a pool's threads (an engine's concurrent requests) share
    # one row as thin sub-rows, squeezed when there are many.
    rows: list[tuple[Process, list[int], float, float]] = []  # process, tids, y top, height
    y = 0.0
    for p in processes:
        groups: dict[str, list[int]] = {}
        for tid in sorted(p.spans, key=lambda t: (p.thread_order.get(t, t), t)):
            groups.setdefault(pool_name(p.threads[tid]), []).append(tid)
        for group in groups.values():
            most = MAX_SUBROWS_HEIGHT if p.name.startswith("engine") else MAX_SUBROWS_HEIGHT / 2
            height = min(float(len(group)), most) if len(group) > 1 else 1.0
            rows.append((p, group, y, height))
            y += height + 0.35
    fig_height = 1.6 + 0.42 * y
    fig, ax = plt.subplots(figsize=(15, fig_height))
    labels = []
    for p, tids, top, height in rows:
        sub = height / len(tids)
        for i, tid in enumerate(tids):
            spans = [s for s in p.spans[tid] if s.end >= lo and s.start <= hi]
            row_top = top + i * sub
            for span in sorted(spans, key=lambda s: s.start - s.end):  # longest first: nested ones on top
                width = max(span.end - span.start, (hi - lo) * 0.0005)
                if contains_others(span, spans):  # a sync around its phases, ...
                    ax.add_patch(Rectangle((span.start - origin, row_top + 0.02), width, sub - 0.04, fill=False,
                                           edgecolor="#3f007d", linewidth=1.0))
                    continue
                ax.add_patch(Rectangle((span.start - origin, row_top + sub * 0.08), width, sub * 0.84,
                                       facecolor=color(span), edgecolor="white" if sub > 0.3 else "none",
                                       linewidth=0.3))
                if sub >= 0.6 and width > (hi - lo) * 0.025 and span.name.startswith(("step", "weight sync")):
                    ax.text(span.start - origin + width / 2, row_top + sub / 2, span.name, ha="center", va="center",
                            fontsize=7, clip_on=True)
        spans = [s for tid in tids for s in p.spans[tid]]
        busy = busy_fraction(spans, lo, hi)
        lane_name = pool_name(p.threads[tids[0]])
        label = p.name if len({pool_name(p.threads[t]) for t in p.spans}) == 1 else f"{p.name}: {lane_name}"
        if len(tids) > 1:
            label += f" (≤{len(tids)} at once)"
        labels.append((top + height / 2, f"{label}\nbusy {busy:.0%}"))
    ax.set_xlim(lo - origin, hi - origin)
    ax.set_ylim(y, -0.2)
    ax.set_yticks([pos for pos, _ in labels], [text for _, text in labels], fontsize=8)
    ax.set_xlabel("seconds since the first span")
    ax.grid(axis="x", color="#e0e0e0", linewidth=0.5)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    if title is None:
        shown = ("train_mode", "max_staleness", "update_weight_transport", "weight_update_mode")
        parts = [f"{k.replace('_', ' ')} {v}" for k, v in other.items() if k in shown and v is not None]
        title = "timeline: " + ", ".join(parts) if parts else "timeline"
    if other.get("dropped_events"):
        title += f"  ({other['dropped_events']} spans dropped at the cap)"
    ax.set_title(title, fontsize=10, loc="left")
    names_seen = {color(s) for s in all_spans}
    handles = [Patch(facecolor=c, label=text) for key, text in LEGEND
               for c in [next(c for prefix, c in COLORS if key.startswith(prefix))] if c in names_seen]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.06 - 0.5 / fig_height), ncol=len(handles),
              fontsize=7, frameon=False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path, help="a trace.json written by --trace-dir")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--title", help="the plot's title (default: the run's mode and transport)")
    parser.add_argument("--start", type=float, help="seconds after the first span where the plot starts")
    parser.add_argument("--end", type=float, help="seconds after the first span where the plot ends")
    args = parser.parse_args(argv)
    try:
        processes, other = load(args.trace)
    except (OSError, ValueError, KeyError) as error:
        print(f"render_trace: cannot read {args.trace}: {error}", file=sys.stderr)
        return 2
    render(processes, other, args.output, title=args.title, window=(args.start, args.end))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
