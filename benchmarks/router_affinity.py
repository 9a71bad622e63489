"""Session affinity vs. cache reuse and tail latency: the router's policies side by side.

Starts CPU engines (a small random Qwen2, one torch thread each) as process children, then
runs the same multi-turn workload through a RouterActor once per policy and scenario:

- workload: ``--sessions`` sessions x ``--turns`` turns, all sessions concurrent; a session's
  turn k+1 prompt = turn k's prompt + answer + a tool observation, so its prefix grows and an
  engine that served turn k holds most of turn k+1 in its prefix cache. Greedy sampling, so
  every policy gets exactly the same prompts; caches are flushed between runs.
- ``uniform``: nothing else runs on the engines.
- ``hot``: one engine also serves another client: ``--hot-requests`` requests with long unique
  prompts kept in flight directly on it (not through the router). They take its batch slots
  and churn its prefix cache, as heavy traffic does to an engine's KV memory; the router sees
  them only through ``/v1/loads``. Turns are short answers after long, growing prompts, so a
  lost prefix costs a long prefill: cache reuse shows up in latency, not only in hit rate.

Printed per run: prefix-cache hit rate (cached_tokens / prompt_tokens over the router's
requests), total time, p50/p95 request latency, session moves. Then the routing overhead:
median latency of a 1-token request through the router minus the same request sent directly
with EngineClient to the same engine (interleaved pairs). Exit status 1 when an acceptance
check fails.

    .venv/bin/python benchmarks/router_affinity.py --repeats 3   # the README table
    .venv/bin/python benchmarks/router_affinity.py --sessions 12 --turns 3 --engines 2   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from actors.router import RouterActor, RouterConfig  # noqa: E402
from slime_async.actor import ActorRef, spawn  # noqa: E402
from slime_async.engine_client import EngineClient, EngineError  # noqa: E402
from slime_async.process import ProcessChild, ProcessSpec, http_ready  # noqa: E402
from slime_async.net import free_port  # noqa: E402
from examples.models.tiny import build_tiny_model  # noqa: E402

POLICIES = ("sticky", "consistent_hash", "least_loaded", "round_robin")
SCENARIOS = ("uniform", "hot")
VOCAB = 512


@dataclass
class Bench:
    sessions: int = 48
    turns: int = 6
    engines: int = 3
    new_tokens: int = 4  # per turn: short answers, long growing prompts (agentic tool turns)
    system_tokens: int = 32  # shared by every session
    problem_tokens: int = 128  # per session
    observation_tokens: int = 48  # appended after each answer
    hot_requests: int = 24
    hot_prompt_tokens: int = 256
    hot_new_tokens: int = 8
    max_running_requests: int = 8
    prefix_cache_max_tokens: int = 8192
    load_interval: float = 0.25
    imbalance_threshold: float = RouterConfig.router_imbalance_threshold
    overhead_pairs: int = 500
    repeats: int = 1  # runs per (scenario, policy); the table shows the median run by p95
    base_port: int = 0  # 0: free ports
    hidden_size: int = 256  # model: large enough that prefilling a long prefix costs real time
    intermediate_size: int = 512
    num_layers: int = 4


@dataclass
class Result:
    scenario: str
    policy: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    moves: int = 0

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# ----- engines ---------------------------------------------------------------------------------------
async def start_engines(bench: Bench, model_dir: Path, log_dir: Path) -> list[tuple[str, ActorRef]]:
    ports = [bench.base_port + i if bench.base_port else free_port() for i in range(bench.engines)]

    async def start(index: int, port: int) -> tuple[str, ActorRef]:
        url = f"http://127.0.0.1:{port}"
        spec = ProcessSpec(
            name=f"engine{index}",
            argv=[sys.executable, "-m", "actors.engine.cpu", "--model-path", str(model_dir), "--host", "127.0.0.1",
                  "--port", str(port), "--num-threads", "1",
                  "--max-running-requests", str(bench.max_running_requests),
                  "--prefix-cache-max-tokens", str(bench.prefix_cache_max_tokens)],
            env={"PYTHONPATH": str(REPO_ROOT), "TOKENIZERS_PARALLELISM": "false"},
            cwd=str(REPO_ROOT),
            ready=http_ready(url + "/health"),
            stop_timeout=5.0,
        )
        return url, await spawn(ProcessChild(spec, log_dir))

    return await asyncio.gather(*(start(i, port) for i, port in enumerate(ports)))




async def flush(urls: list[str]) -> None:
    for url in urls:
        async with EngineClient(url) as client:
            await client.flush_cache()


# ----- workload ----------------------------------------------------------------------------------------
def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


async def conversation(router: ActorRef, bench: Bench, index: int, tag: str, result: Result) -> None:
    rng = random.Random(1000 + index)  # the same prompts for every policy
    ids = tokens(random.Random(7), bench.system_tokens) + tokens(rng, bench.problem_tokens)
    params = {"max_new_tokens": bench.new_tokens, "temperature": 0.0, "ignore_eos": True}
    for _ in range(bench.turns):
        started = time.perf_counter()
        response = await router.ask("generate", ids, params, session_id=f"{tag}-{index}", timeout=None)
        result.latencies.append(time.perf_counter() - started)
        meta = response["meta_info"]
        result.prompt_tokens += meta["prompt_tokens"]
        result.cached_tokens += meta["cached_tokens"]
        ids = ids + response["output_ids"] + tokens(rng, bench.observation_tokens)


async def other_client(url: str, bench: Bench, stop: asyncio.Event, seed: int) -> None:
    """Traffic the router does not send: long requests with unique prompts, back to back."""
    rng = random.Random(seed)
    params = {"max_new_tokens": bench.hot_new_tokens, "temperature": 1.0, "ignore_eos": True}
    async with EngineClient(url) as client:
        while not stop.is_set():
            try:
                await client.generate(tokens(rng, bench.hot_prompt_tokens), params)
            except EngineError:
                return


async def run(bench: Bench, scenario: str, policy: str, urls: list[str]) -> Result:
    await flush(urls)
    # A generous health timeout: on 2 oversubscribed cores a loaded CPU engine can take seconds
    # to answer, and this benchmark is about placement, not failover.
    config = RouterConfig(router_policy=policy, router_load_interval=bench.load_interval, router_health_interval=30.0,
                          router_health_timeout=60.0, router_imbalance_threshold=bench.imbalance_threshold)
    router = await spawn(RouterActor(config, urls))
    result = Result(scenario, policy)
    stop = asyncio.Event()
    others = []
    if scenario == "hot":
        others = [asyncio.ensure_future(other_client(urls[0], bench, stop, seed)) for seed in range(bench.hot_requests)]
        await asyncio.sleep(2 * bench.load_interval + 0.5)  # the router has seen the hot engine's load
    try:
        started = time.perf_counter()
        await asyncio.gather(*(conversation(router, bench, i, f"{scenario}-{policy}", result)
                               for i in range(bench.sessions)))
        result.seconds = time.perf_counter() - started
        result.moves = int((await router.ask("metrics"))["router/session_moves"])
    finally:
        stop.set()
        if others:
            async with EngineClient(urls[0]) as client:
                await client.abort_request(abort_all=True)
            await asyncio.gather(*others)
        await router.stop()
    return result


async def routing_overhead(bench: Bench, url: str) -> tuple[float, float, float]:
    """Median direct latency, median routed latency, median of the per-pair difference (ms).

    Pairs alternate which path goes first, so a drift in the engine's speed (other processes
    on the same cores) does not favour either path."""
    router = await spawn(RouterActor(RouterConfig(router_load_interval=0.0, router_health_interval=30.0), [url]))
    ids = list(range(10, 42))
    params = {"max_new_tokens": 1, "temperature": 0.0}
    direct, routed = [], []
    try:
        async with EngineClient(url) as client:
            async def timed_direct() -> None:
                started = time.perf_counter()
                await client.generate(ids, params)
                direct.append(time.perf_counter() - started)

            async def timed_routed() -> None:
                started = time.perf_counter()
                await router.ask("generate", ids, params, session_id="overhead")
                routed.append(time.perf_counter() - started)

            for _ in range(10):  # warm both connection pools and the engine's cache
                await client.generate(ids, params)
                await router.ask("generate", ids, params, session_id="overhead")
            for pair in range(bench.overhead_pairs):
                first, second = (timed_direct, timed_routed) if pair % 2 == 0 else (timed_routed, timed_direct)
                await first()
                await second()
    finally:
        await router.stop()
    diffs = [r - d for r, d in zip(routed, direct)]
    return statistics.median(direct) * 1000, statistics.median(routed) * 1000, statistics.median(diffs) * 1000


async def instant_engine_overhead(pairs: int) -> float:
    """The same measurement against an in-process engine that answers at once: the router's
    own cost without the CPU engine's latency noise (median difference, ms)."""
    from aiohttp import web

    answer = {"output_ids": [7], "meta_info": {"prompt_tokens": 32, "cached_tokens": 31, "completion_tokens": 1,
                                               "finish_reason": {"type": "length"}, "weight_version": "0"}}

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        _, _, overhead = await routing_overhead(Bench(overhead_pairs=pairs), f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
    return overhead


def median_run(runs: list[Result]) -> Result:
    """The run with the median p95 (an actual run, so its columns belong together)."""
    return sorted(runs, key=lambda r: r.p(0.95))[len(runs) // 2]


# ----- report --------------------------------------------------------------------------------------------
def table(results: list[Result]) -> str:
    lines = [
        "| scenario | policy | prefix-cache hit rate | total s | p50 ms | p95 ms | session moves |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.scenario} | {r.policy} | {r.hit_rate:.3f} | {r.seconds:.1f} | {r.p(0.50):.0f} | "
                     f"{r.p(0.95):.0f} | {r.moves} |")
    return "\n".join(lines)


def checks(results: list[Result], overhead_ms: float) -> list[tuple[bool, str]]:
    """The acceptance bar: under skew sticky keeps at least consistent_hash's cache reuse with a
    better tail; in every scenario it reuses more than round_robin; the hop costs <= 1 ms."""
    get = {(r.scenario, r.policy): r for r in results}
    out = []
    sticky, chash = get.get(("hot", "sticky")), get.get(("hot", "consistent_hash"))
    if sticky and chash:
        out.append((sticky.hit_rate >= chash.hit_rate,
                    f"hot: sticky hit rate {sticky.hit_rate:.3f} >= consistent_hash {chash.hit_rate:.3f}"))
        out.append((sticky.p(0.95) < chash.p(0.95),
                    f"hot: sticky p95 {sticky.p(0.95):.0f} ms < consistent_hash {chash.p(0.95):.0f} ms"))
    for scenario in SCENARIOS:
        sticky, rr = get.get((scenario, "sticky")), get.get((scenario, "round_robin"))
        if sticky and rr:
            out.append((sticky.hit_rate > rr.hit_rate,
                        f"{scenario}: sticky hit rate {sticky.hit_rate:.3f} > round_robin {rr.hit_rate:.3f}"))
    out.append((overhead_ms <= 1.0, f"median routing overhead {overhead_ms:.3f} ms <= 1 ms"))
    return out


async def main(bench: Bench, policies: list[str], scenarios: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", hidden_size=bench.hidden_size, num_layers=bench.num_layers,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=bench.intermediate_size, max_position_embeddings=2048)
        print(f"starting {bench.engines} CPU engines ...", flush=True)
        engines = await start_engines(bench, model_dir, Path(tmp) / "logs")
        urls = [url for url, _ in engines]
        try:
            direct_ms, routed_ms, overhead_ms = await routing_overhead(bench, urls[0])
            instant_ms = await instant_engine_overhead(max(bench.overhead_pairs, 1000))
            results = []
            for scenario in scenarios:
                runs: dict[str, list[Result]] = {policy: [] for policy in policies}
                for repeat in range(bench.repeats):
                    # Rotate the order so no policy always runs first (machine load drifts).
                    for policy in policies[repeat % len(policies):] + policies[:repeat % len(policies)]:
                        result = await run(bench, scenario, policy, urls)
                        print(f"  {scenario:8s} {policy:16s} hit {result.hit_rate:.3f}  {result.seconds:6.1f} s  "
                              f"p95 {result.p(0.95):6.0f} ms  moves {result.moves}", flush=True)
                        runs[policy].append(result)
                results += [median_run(runs[policy]) for policy in policies]
        finally:
            await asyncio.gather(*(ref.stop() for _, ref in engines))
    print()
    if bench.repeats > 1:
        print(f"each row: the median (by p95) of {bench.repeats} runs")
    print(f"{bench.sessions} sessions x {bench.turns} turns over {bench.engines} CPU engines "
          f"(max {bench.max_running_requests} running, prefix cache {bench.prefix_cache_max_tokens} tokens); "
          f"hot = {bench.hot_requests} requests of another client ({bench.hot_prompt_tokens}+{bench.hot_new_tokens} "
          f"tokens) kept in flight on one engine")
    print(table(results))
    print()
    print(f"routing overhead (1-token request, {bench.overhead_pairs} interleaved pairs): direct median "
          f"{direct_ms:.2f} ms, router median {routed_ms:.2f} ms, median difference {overhead_ms:.3f} ms; "
          f"against an instant in-process engine: {instant_ms:.3f} ms")
    failed = 0
    for ok, text in checks(results, overhead_ms):
        print(f"  [{'ok' if ok else 'FAIL'}] {text}")
        failed += not ok
    return 1 if failed else 0


def parse_args() -> tuple[Bench, list[str], list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Bench()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    args = vars(parser.parse_args())
    policies, scenarios = args.pop("policies"), args.pop("scenarios")
    return Bench(**args), policies, scenarios


if __name__ == "__main__":
    from slime_async.runtime import run as run_loop  # uvloop when installed

    bench, policies, scenarios = parse_args()
    raise SystemExit(run_loop(lambda: main(bench, policies, scenarios)))
