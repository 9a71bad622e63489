"""The router's HTTP front under agent load: N concurrent multi-turn tool-calling sessions, streamed.

Each session is an agent loop over Chat Completions with ``tools`` and ``stream=True``, from the
real ``openai`` async client (one ``AsyncOpenAI`` shared by every session, its connection pool
as large as the number of sessions, as an agent server would hold it; no retries, so every
failure counts) or, with ``--client aiohttp``, the same requests and server-sent events in plain
aiohttp (the openai client's own CPU cost starves a 2-core machine at 1,000 sessions): it asks, and when the
answer is a tool call it sends the tool's result back; otherwise the next user question. Every
turn names its session (``X-Session-Id``), so the front records it.

The router is ``slime-async router`` in its own process, in front of either the embedded CPU
engine on a tiny random model, or ``benchmarks/instant_engine.py`` (answers at once, so what is
measured is the front itself). Printed, for the load stretch only (the router's histograms are
read before and after and subtracted):

- requests/s (client turns), client-seen p50/p99 latency of a turn (request to last chunk);
- the latency the front adds over the engine, p50/p99 (measured inside the router: each
  request's handler time less its engine requests' time, ``GET /front_stats``);
- the router's event-loop lag, p50/p99/max (a probe task inside the router, same endpoint);
- the garbage collector's share of it: collections, the longest, full collections and their
  wall and CPU time (``gc_pauses``, same endpoint);
- the router process's CPU time per request (the front's cost, whoever else wants the cores);
- the router's RSS growth over the run and per recorded session;
- errors (failed turns), with the first message.

    python benchmarks/front_load.py --engine instant --sessions 1000 --turns 3
    python benchmarks/front_load.py --sessions 100 --turns 2 --answer-tokens 4096 --max-tokens 4096  # long answers
    python benchmarks/front_load.py --engine-url http://127.0.0.1:30000 --model-path /models/Qwen2.5-0.5B-Instruct
    python benchmarks/front_load.py --engine cpu --sessions 200 --turns 2 --max-tokens 16
    python benchmarks/front_load.py --engine instant --client aiohttp --front-concurrency 0  # no gate
    python benchmarks/front_load.py --engine instant --client aiohttp --profile router.prof  # where its CPU goes
    python benchmarks/front_load.py --engine instant --client aiohttp --router-cpus 8-9  # the router on cores of its own
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from actors.engine.cpu.local import start_local_engine, stop_local_engine  # noqa: E402
from slime_async.loop_lag import buckets_of, quantile_ms  # noqa: E402

ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
SYSTEM = "You are a careful calculator. Use the add tool for every sum."
QUESTIONS = ("What is 2 + 3?", "And 17 + 25?", "Now 1000 + 24?", "Finally 6 + 7?")


@dataclass
class Turn:
    prompt_ids: list[int]
    output_ids: list[int]
    finish: str | None


@dataclass
class LoadResult:
    turns: dict[str, list[Turn]] = field(default_factory=dict)  # by session id
    latencies: list[float] = field(default_factory=list)  # seconds per turn, client-seen
    errors: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0

    @property
    def requests(self) -> int:
        return len(self.latencies)


@dataclass
class Answer:
    prompt_ids: list[int]
    output_ids: list[int]
    content: str
    calls: list[dict[str, str]]  # {"id", "name", "arguments"}
    finish: str | None


async def openai_turn(client: Any, session_id: str, request: dict[str, Any]) -> Answer:
    """One streamed chat turn through the ``openai`` client."""
    stream = await client.chat.completions.create(**request, stream=True, extra_headers={"X-Session-Id": session_id})
    answer, calls = Answer([], [], "", [], None), {}
    async for chunk in stream:
        answer.prompt_ids = (chunk.model_extra or {}).get("prompt_token_ids", answer.prompt_ids)
        for choice in chunk.choices:
            answer.output_ids += (choice.model_extra or {}).get("token_ids") or []
            answer.content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": call.function.arguments}
            answer.finish = choice.finish_reason or answer.finish
    answer.calls = list(calls.values())
    return answer


async def aiohttp_turn(client: Any, session_id: str, request: dict[str, Any]) -> Answer:
    """The same turn in plain HTTP: the request body and server-sent events the ``openai`` client
    sends and reads, parsed with orjson (a fraction of the client's CPU, so one client process can
    keep a thousand sessions busy)."""
    import orjson

    session, url = client
    answer, calls = Answer([], [], "", [], None), {}
    async with session.post(url, data=orjson.dumps(request | {"stream": True}),
                            headers={"X-Session-Id": session_id, "Content-Type": "application/json"}) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            answer.prompt_ids = chunk.get("prompt_token_ids", answer.prompt_ids)
            for choice in chunk.get("choices", []):
                answer.output_ids += choice.get("token_ids") or []
                delta = choice.get("delta") or {}
                answer.content += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    calls[call["index"]] = {"id": call["id"], "name": call["function"]["name"],
                                            "arguments": call["function"]["arguments"]}
                answer.finish = choice.get("finish_reason") or answer.finish
    answer.calls = list(calls.values())
    return answer


async def run_session(turn_fn: Any, client: Any, session_id: str, turns: int, max_tokens: int, result: LoadResult,
                      stop: list[str] | None = None) -> None:
    """One agent: ``turns`` streamed chat requests, each following the last answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    record = result.turns.setdefault(session_id, [])
    for turn in range(turns):
        request = {"model": "tiny", "messages": messages, "tools": [ADD_TOOL], "max_tokens": max_tokens}
        if stop:
            request["stop"] = stop
        start = time.perf_counter()
        try:
            answer = await turn_fn(client, session_id, request)
        except Exception as error:  # noqa: BLE001 - counted and reported: the goal is none
            cause = f" ({type(error.__cause__).__name__}: {error.__cause__})" if error.__cause__ else ""
            result.errors[f"{type(error).__name__}: {str(error)[:200]}{cause[:200]}"] += 1
            return
        result.latencies.append(time.perf_counter() - start)
        record.append(Turn(answer.prompt_ids, answer.output_ids, answer.finish))
        if answer.calls:
            messages.append({"role": "assistant", "content": answer.content or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in answer.calls]})
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": "5"} for c in answer.calls]
        else:
            messages += [{"role": "assistant", "content": answer.content},
                         {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]}]


async def run_load(base_url: str, sessions: int, turns: int, max_tokens: int, prefix: str = "load",
                   stop: list[str] | None = None, client: str = "openai") -> LoadResult:
    """``sessions`` agents at once against the front at ``base_url``; every turn's ids and timing.
    ``client``: ``openai`` (one AsyncOpenAI, no retries, a pool as large as ``sessions``) or
    ``aiohttp`` (the same requests in plain HTTP)."""
    result = LoadResult()
    if client == "openai":
        import httpx
        import openai

        limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
        http = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0))
        handle: Any = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", http_client=http, max_retries=0)
        turn_fn, close = openai_turn, handle.close
    else:
        import aiohttp

        http_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions),
                                             timeout=aiohttp.ClientTimeout(total=600))
        handle, turn_fn, close = (http_session, base_url + "/v1/chat/completions"), aiohttp_turn, http_session.close
    start = time.perf_counter()
    try:
        await asyncio.gather(*(run_session(turn_fn, handle, f"{prefix}-{k}", turns, max_tokens, result, stop)
                               for k in range(sessions)))
    finally:
        result.wall = time.perf_counter() - start
        await close()
    return result


# ----- the benchmark: processes, measurements, the table ----------------------------------------------


def _start(command: list[str], pattern: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start ``command``; its URL from the first output line matching ``pattern``."""
    log = open(log_path, "w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
                               start_new_session=True)  # its own group: stop_local_engine signals it
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        log.write(line)
        match = re.search(pattern, line)
        if match:
            # the rest of its output goes to the log, so a full pipe never blocks it
            subprocess.Popen(["cat"], stdin=process.stdout, stdout=log)
            return process, match.group(1)
    raise RuntimeError(f"{' '.join(command[:6])} ... did not start; its output: {log_path}")


def parse_cpu_list(text: str) -> set[int]:
    """``taskset -c``'s list (``8``, ``8-9``, ``0,2-3``) as a set of CPUs; ValueError if malformed
    or naming a CPU the machine does not have (not this process's own affinity: the GPU driver
    pins the client to other cores than the router's)."""
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        raise ValueError(f"--router-cpus: {text!r} is not a CPU list like 8, 8-9 or 0,2-3")
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus |= set(range(int(first), int(last or first) + 1))
    import os

    count = os.cpu_count() or 1
    if not cpus or max(cpus) >= count:
        raise ValueError(f"--router-cpus: {text!r} names CPUs outside this machine's 0-{count - 1}")
    return cpus


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (/proc/PID/stat fields 14 and 15)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get_json(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def summarize(result: LoadResult, before: dict[str, Any], after: dict[str, Any], rss: tuple[float, float],
              sessions: int, router_cpu: float | None = None) -> dict[str, Any]:
    """The table's numbers from the client's result and the router's two /front_stats snapshots."""
    lag = buckets_of(after["loop_lag"], before["loop_lag"])
    added = buckets_of(after["front_added"], before["front_added"])
    latencies = sorted(result.latencies)
    pick = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000) if latencies else None
    return {
        "sessions": sessions, "requests": result.requests,
        "output_tokens": sum(len(t.output_ids) for turns in result.turns.values() for t in turns),
        "tool_call_turns": sum(t.finish == "tool_calls" for turns in result.turns.values() for t in turns), "wall_s": round(result.wall, 2),
        "requests_per_s": round(result.requests / result.wall, 1) if result.wall else 0.0,
        "client_p50_ms": pick and round(pick(0.5), 1), "client_p99_ms": pick and round(pick(0.99), 1),
        "front_added_p50_ms": quantile_ms(added, 0.5), "front_added_p99_ms": quantile_ms(added, 0.99),
        "loop_lag_p50_ms": quantile_ms(lag, 0.5), "loop_lag_p99_ms": quantile_ms(lag, 0.99),
        "loop_lag_max_ms": (max(lag) + 1.0) if lag else None, "loop_lag_samples": sum(lag.values()),
        **_gc_row(before.get("gc_pauses"), after.get("gc_pauses")),
        "router_cpu_ms_per_request": (round(router_cpu * 1000 / result.requests, 2)
                                      if router_cpu is not None and result.requests else None),
        "rss_growth_mib": round(rss[1] - rss[0], 1),
        "bytes_per_session": round((rss[1] - rss[0]) * 2**20 / sessions) if sessions else 0,
        "errors": sum(result.errors.values()), "first_error": next(iter(result.errors), None),
        "load_average_1m": round(__import__("os").getloadavg()[0], 1),  # other work on the machine
    }


def _gc_row(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """The garbage collector's pauses during the load (a router without the histogram: none)."""
    if before is None or after is None:
        return {}
    pauses = buckets_of(after, before)
    seconds = {g: after["seconds_by_generation"].get(g, 0.0) - before["seconds_by_generation"].get(g, 0.0)
               for g in after["seconds_by_generation"]}
    full = after["collections_by_generation"].get("2", 0) - before["collections_by_generation"].get("2", 0)
    return {"gc_collections": sum(pauses.values()), "gc_full_collections": full, "gc_pause_max_ms": (max(pauses) + 1.0) if pauses else None,
            "gc_full_collections_s": round(seconds.get("2", 0.0), 3), "gc_total_s": round(sum(seconds.values()), 3),
            "gc_full_collections_cpu_s": round(after["cpu_seconds_by_generation"].get("2", 0.0)
                                               - before["cpu_seconds_by_generation"].get("2", 0.0), 3)}


def print_table(label: str, row: dict[str, Any]) -> None:
    print(f"\n== front load: {label} ==")
    for key, value in row.items():
        print(f"  {key:20s} {value}")


async def measure(router_url: str, router_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    await run_load(router_url, min(8, args.sessions), 1, args.max_tokens, prefix="warmup", client=args.client)
    before, rss_before, cpu = _get_json(router_url + "/front_stats"), _rss_mib(router_pid), _cpu_seconds(router_pid)
    result = await run_load(router_url, args.sessions, args.turns, args.max_tokens, stop=args.stop, client=args.client)
    cpu = _cpu_seconds(router_pid) - cpu
    after, rss_after = _get_json(router_url + "/front_stats"), _rss_mib(router_pid)
    return summarize(result, before, after, (rss_before, rss_after), args.sessions, cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["instant", "cpu"], default="instant")
    parser.add_argument("--engine-url", default=None,
                        help="an engine already running (e.g. SGLang with --skip-tokenizer-init); needs --model-path")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--answer-tokens", type=int, default=None,
                        help="instant engine: final answers this many tokens long (long outputs; raise --max-tokens)")
    parser.add_argument("--model-path", type=Path, default=None,
                        help="HF model dir (default: a tiny random Qwen2 with a tool-calling template)")
    parser.add_argument("--client", choices=["openai", "aiohttp"], default="openai",
                        help="openai: the real client; aiohttp: the same protocol for a fraction of the CPU")
    parser.add_argument("--stop", nargs="*", default=["Observation:"],
                        help="stop strings every request sends (ReAct agents stop at 'Observation:'; "
                             "none: --stop with no value); they make the front search the text after every chunk")
    parser.add_argument("--chunk-tokens", type=int, default=None, help="the router's --chunk-tokens (default its own)")
    parser.add_argument("--front-concurrency", type=int, default=None,
                        help="the router's --front-concurrency (default its own; 0 = no bound)")
    parser.add_argument("--router-cpus", default=None,
                        help="run the router on these CPUs only (taskset -c list, e.g. 8-9): a core of its own, "
                             "apart from the client and the engine")
    parser.add_argument("--profile", type=Path, default=None, help="run the router under cProfile (its main thread's CPU time, benchmarks/cpu_profile.py), stats here")
    parser.add_argument("--json", type=Path, default=None, help="also write the row here")
    args = parser.parse_args(argv)
    if args.engine_url is not None and args.model_path is None:
        parser.error("--engine-url needs --model-path (the tokenizer and chat template the engine's model uses)")
    if args.router_cpus is not None:
        try:
            parse_cpu_list(args.router_cpus)
        except ValueError as error:
            parser.error(str(error))
    work = Path(tempfile.mkdtemp(prefix="front-load-"))
    model = args.model_path
    if model is None:
        from examples.models.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model, set_chat_template

        # a long context, so long answers are not cut by the context end (the instant engine does not care)
        model = set_chat_template(build_tiny_model(work / "tiny", arch="qwen2", seed=0, max_position_embeddings=32768),
                                  TOOL_CHAT_TEMPLATE)
    python = sys.executable
    if args.engine_url is not None:  # already running (SGLang on a GPU): neither started nor stopped here
        engine, engine_url = None, args.engine_url
    elif args.engine == "instant":
        long = [] if args.answer_tokens is None else ["--answer-tokens", str(args.answer_tokens)]
        engine, engine_url = _start([python, "-m", "benchmarks.instant_engine", "--model-path", str(model), *long],
                                    r"listening on (http://\S+)", work / "engine.log")
    else:
        engine, engine_url = start_local_engine(model, work / "engine.log")
    router = None
    try:
        profile = [] if args.profile is None else ["-m", "benchmarks.cpu_profile", str(args.profile.resolve())]
        pin = [] if args.router_cpus is None else ["taskset", "-c", args.router_cpus]
        router, router_url = _start(
            [*pin, python, *(profile or ["-m"]), "actors.loop.cli", "router", "--engine-url", engine_url, "--model-path", str(model),
             "--port", "0", "--max-recorded-sessions", str(args.sessions + 16), "--log-level", "warning",
             *([] if args.chunk_tokens is None else ["--chunk-tokens", str(args.chunk_tokens)]),
             *([] if args.front_concurrency is None else ["--front-concurrency", str(args.front_concurrency)])],
            r"router listening on (http://\S+)", work / "router.log")
        row = asyncio.run(measure(router_url, router.pid, args))
    finally:
        if router is not None:
            router.terminate()
            router.wait(timeout=60)
        if engine is not None:
            stop_local_engine(engine)
    print_table(f"{args.engine_url or args.engine} engine, {args.client} client, {args.sessions} sessions x {args.turns} turns, "
                f"max_tokens {args.max_tokens}, stop {args.stop}, chunk_tokens {args.chunk_tokens or 'default'}, "
                f"front_concurrency {'default' if args.front_concurrency is None else args.front_concurrency}", row)
    if args.json is not None:  # with the load's parameters, so a table can be made from the files alone
        load = {"engine": args.engine_url or args.engine, "client": args.client, "turns": args.turns,
                "max_tokens": args.max_tokens, "chunk_tokens": args.chunk_tokens,
                "front_concurrency": args.front_concurrency, "router_cpus": args.router_cpus}
        args.json.write_text(json.dumps(load | row, indent=1) + "\n")
    return 0 if row["errors"] == 0 else 1


if __name__ == "__main__":
    # SIGTERM (a driver's `timeout`) unwinds like an exception, so main's router and engine are stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    raise SystemExit(main())
