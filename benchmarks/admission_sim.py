"""Admission simulation: the H200 long-tail workload against the real BufferActor, old policy
beside new, in virtual time (a run takes seconds and is the same every time).

What is simulated (defaults from benchmarks/gpu/results/one_gpu, Qwen2.5-0.5B on one H200):

- workload ``longtail`` (benchmarks/gpu/longtail.py): groups of 8 samples, 10% of samples forced
  to 2,048 tokens, the rest at most 128 (64% of those reach it, the others stop uniformly before:
  the measured truncated ratio of 0.68); G = 32 groups a step.
- engine: continuous batching; each iteration gives every running request one token and takes
  ``t0 + c · N`` seconds for N running (decode: weights read once per iteration, KV per request).
  t0 = 1.6 ms, c = 59 µs give ~600 tokens/s to a lone request (sync mode's 2,048-token tail takes
  ~3.5 s) and ~15.5k tokens/s at the ~300 requests the fully-async runs kept in flight, so a
  long sample there takes ~40 s, far more than (k + 1) steps. Tokens carry the policy version of
  the moment they are generated (``--weight-update-mode in_place``).
- rollout: reserves a slot in the buffer for each group (``reserve``), generates its 8 samples
  at once (at most ``--concurrency`` generations in flight, 2 × the engine's 2,624 slots), puts
  the group with the admission version it was given.
- trainer: takes G groups (``get``), trains ``--train-s`` seconds, syncs ``--sync-s`` seconds,
  bumps the version (``set_version``); checks that no trained token (loss mask 1 after the
  ``--mask-offpolicy-in-partial-rollout`` mask, when on) is more than k versions old.

Printed per policy and k: groups finished (put) and trained, stale drops as a share of the
finished groups, samples dropped (a dropped group's samples, plus samples whose every token the
off-policy mask zeroed), tokens masked, trainer wait (share of the training wall time spent in
``get``), engine busy (share of it with at least one request running), engine and trained tokens/s,
step time, the largest trained staleness, and bound violations (must be 0).

    python benchmarks/admission_sim.py                         # k = 1, 2, 4; old and new side by side
    python benchmarks/admission_sim.py --k 2 --steps 100 --seeds 1 2 3
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.buffer import BufferActor, BufferConfig, default_capacity  # noqa: E402
from slime_async.actor import spawn  # noqa: E402
from slime_async.sample import Sample, Status  # noqa: E402


@dataclass(frozen=True)
class SimConfig:
    max_staleness: int = 2
    groups_per_step: int = 32
    samples_per_group: int = 8
    long_fraction: float = 0.10
    long_tokens: int = 2048
    short_tokens: int = 128
    short_at_cap: float = 0.64  # short samples that run to short_tokens; the rest stop uniformly before
    t0_s: float = 0.0016  # engine iteration time: t0 + c · running
    per_request_s: float = 0.000059
    max_running: int = 2624  # the engine's slots; requests beyond wait in its queue
    concurrency: int = 5248  # generations the rollout keeps in flight at most
    train_s: float = 1.5
    sync_s: float = 0.1
    steps: int = 60
    seed: int = 1
    tick_s: float = 0.05  # virtual seconds the engine advances between two looks at the actors


@dataclass(frozen=True)
class Policy:
    name: str
    straggler_policy: str  # --straggler-policy
    mask_offpolicy: bool = False  # --mask-offpolicy-in-partial-rollout


POLICIES = {
    "old": Policy("old: drop stale groups", "drop"),
    "old+mask": Policy("old + --mask-offpolicy-in-partial-rollout", "drop", mask_offpolicy=True),
    "new": Policy("new: wait for deadline groups", "wait"),
}


@dataclass
class SimResult:
    finished_groups: int = 0
    trained_groups: int = 0
    dropped_groups: int = 0
    dropped_samples: int = 0
    masked_tokens: int = 0
    trained_tokens: int = 0
    generated_tokens: int = 0
    trainer_wait_s: float = 0.0
    busy_s: float = 0.0
    wall_s: float = 0.0
    staleness_max: int = 0
    violations: int = 0
    step_times: list[float] = field(default_factory=list)

    @property
    def dropped_frac(self) -> float:
        return self.dropped_groups / max(1, self.finished_groups)

    @property
    def trainer_wait_frac(self) -> float:
        return self.trainer_wait_s / self.wall_s

    @property
    def busy_frac(self) -> float:
        return self.busy_s / self.wall_s

    @property
    def engine_tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s

    @property
    def trained_tokens_per_s(self) -> float:
        return self.trained_tokens / self.wall_s

    @property
    def step_s(self) -> float:
        return statistics.mean(self.step_times)


class _Engine:
    """Continuous batching in virtual time: requests FIFO, the first ``max_running`` decode."""

    def __init__(self, config: SimConfig):
        self.config = config
        self.now = 0.0
        self.version = 0
        self.running: list[tuple[Sample, int, asyncio.Future]] = []  # (sample, tokens left, done)
        self.tokens = 0
        self.busy_s = 0.0

    def submit(self, sample: Sample, tokens: int) -> asyncio.Future:
        done = asyncio.get_running_loop().create_future()
        self.running.append((sample, tokens, done))
        return done

    def advance(self, until: float) -> None:
        """Decode until virtual time ``until`` (whole iterations; the last may end after it)."""
        while self.now < until:
            n = min(len(self.running), self.config.max_running)
            if n == 0:
                self.now = until
                return
            iteration = self.config.t0_s + self.config.per_request_s * n
            # Whole iterations up to ``until``, at most until the shortest running request ends.
            shortest = min(left for _, left, _ in self.running[:n])
            steps = max(1, min(shortest, int((until - self.now) / iteration) or 1))
            self.now += steps * iteration
            self.busy_s += steps * iteration
            kept = []
            for i, (sample, left, done) in enumerate(self.running):
                if i < n:
                    sample.append_generated([5] * steps, [-1.0] * steps, version=self.version)
                    self.tokens += steps
                    left -= steps
                    if left == 0:
                        done.set_result(None)
                        continue
                kept.append((sample, left, done))
            self.running = kept


async def _settle(rounds: int = 30) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def _lengths(config: SimConfig, rng: random.Random) -> list[int]:
    out = []
    for _ in range(config.samples_per_group):
        if rng.random() < config.long_fraction:
            out.append(config.long_tokens)
        elif rng.random() < config.short_at_cap:
            out.append(config.short_tokens)
        else:
            out.append(rng.randint(1, config.short_tokens - 1))
    return out


async def simulate(config: SimConfig, policy: Policy) -> SimResult:
    """One run: ``config.steps`` training steps of the rollout, engine and trainer above."""
    k, g = config.max_staleness, config.groups_per_step
    buffer_config = BufferConfig(buffer_capacity=default_capacity(k, g), max_staleness=k,
                                 mask_offpolicy_in_partial_rollout=policy.mask_offpolicy,
                                 straggler_policy=policy.straggler_policy)
    buffer = await spawn(BufferActor(buffer_config, groups_per_step=g))
    engine = _Engine(config)
    rng = random.Random(config.seed)
    result = SimResult()
    slots = asyncio.Semaphore(config.concurrency)
    wake: list[tuple[float, asyncio.Future]] = []  # the trainer's virtual sleeps

    def sleep(seconds: float) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        wake.append((engine.now + seconds, future))
        return future

    async def run_group(group_index: int, admitted: int) -> None:
        samples = [Sample(group_index=group_index, index=i, prompt="p", tokens=[1]) for i in
                   range(config.samples_per_group)]

        async def one(sample: Sample, tokens: int) -> None:
            async with slots:
                await engine.submit(sample, tokens)
            sample.status = Status.COMPLETED

        await asyncio.gather(*(one(s, n) for s, n in zip(samples, _lengths(config, rng))))
        result.finished_groups += 1
        await buffer.ask("put", samples, admitted=admitted, timeout=None)

    async def produce() -> None:
        tasks = set()
        for group_index in range(10**9):
            admitted = await buffer.ask("reserve", timeout=None)
            task = asyncio.ensure_future(run_group(group_index, admitted))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def train() -> None:
        version = 0
        for _ in range(config.steps):
            started = engine.now
            groups = await buffer.ask("get", g, version, timeout=None)
            result.trainer_wait_s += engine.now - started
            for group in groups:
                for sample in group:
                    trained = [v for v in sample.token_versions if not (policy.mask_offpolicy and version - v > k)]
                    result.masked_tokens += len(sample.token_versions) - len(trained)
                    result.trained_tokens += len(trained)
                    result.dropped_samples += not trained
                    if trained:
                        result.staleness_max = max(result.staleness_max, version - min(trained))
                        result.violations += version - min(trained) > k
            result.trained_groups += len(groups)
            await sleep(config.train_s)
            await sleep(config.sync_s)
            version += 1
            engine.version = version  # in place: the engines' next tokens are the new version's
            await buffer.ask("set_version", version, timeout=None)
            result.step_times.append(engine.now - started)

    producer = asyncio.ensure_future(produce())
    trainer = asyncio.ensure_future(train())
    try:
        while not trainer.done():
            if engine.now > config.steps * 600:
                raise RuntimeError(f"no step for 600 virtual seconds at {engine.now:.0f} s: a deadlock")
            await _settle()
            due = [w for w in wake if w[0] <= engine.now]
            for entry in due:
                wake.remove(entry)
                entry[1].set_result(None)
            if due:
                continue
            engine.advance(min([engine.now + config.tick_s] + [t for t, _ in wake]))
        trainer.result()
    finally:
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        metrics = await buffer.ask("metrics")
        await buffer.stop()
    result.dropped_groups = int(metrics["buffer/dropped_stale"])
    result.dropped_samples += int(metrics["buffer/dropped_stale_samples"])
    result.generated_tokens = engine.tokens
    result.busy_s = engine.busy_s
    result.wall_s = engine.now
    return result


def run(config: SimConfig, policy: Policy) -> SimResult:
    return asyncio.run(simulate(config, policy))


def table(rows: list[tuple[int, Policy, list[SimResult]]], config: SimConfig) -> str:
    lines = [f"long-tail workload: G = {config.groups_per_step} groups of {config.samples_per_group}, "
             f"{config.long_fraction:.0%} of samples {config.long_tokens} tokens, the rest <= {config.short_tokens}; "
             f"{config.steps} steps per run, means over the seeds",
             "",
             "| k | policy | groups finished | trained | stale drops (of finished) | samples dropped "
             "| tokens masked | trainer wait | engine busy | engine tok/s | trained tok/s | step s "
             "| staleness max | bound violations |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k, policy, results in rows:
        def mean(name: str) -> float:
            return statistics.mean(getattr(r, name) for r in results)
        lines.append(
            f"| {k} | {policy.name} | {mean('finished_groups'):.0f} | {mean('trained_groups'):.0f} "
            f"| {mean('dropped_groups'):.1f} ({mean('dropped_frac'):.1%}) | {mean('dropped_samples'):.0f} "
            f"| {mean('masked_tokens'):.0f} | {mean('trainer_wait_frac'):.0%} | {mean('busy_frac'):.0%} "
            f"| {mean('engine_tokens_per_s'):,.0f} | {mean('trained_tokens_per_s'):,.0f} | {mean('step_s'):.2f} "
            f"| {max(r.staleness_max for r in results)} | {sum(r.violations for r in results)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 2, 4], help="values of --max-staleness")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--steps", type=int, default=SimConfig.steps)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--train-s", type=float, default=SimConfig.train_s, help="seconds a train step takes")
    parser.add_argument("--sync-s", type=float, default=SimConfig.sync_s, help="seconds a weight sync takes")
    parser.add_argument("--concurrency", type=int, default=SimConfig.concurrency,
                        help="generations the rollout keeps in flight at most")
    args = parser.parse_args(argv)
    base = SimConfig(steps=args.steps, train_s=args.train_s, sync_s=args.sync_s, concurrency=args.concurrency)
    rows = []
    for k in args.k:
        for name in args.policies:
            policy = POLICIES[name]
            rows.append((k, policy, [run(replace(base, max_staleness=k, seed=s), policy) for s in args.seeds]))
    print(table(rows, base))
    return 0 if all(r.violations == 0 for _, _, results in rows for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
