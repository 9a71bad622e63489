"""RolloutActor: turns prompts into scored groups of samples and hands them to the buffer.

A producer task asks the buffer to ``reserve`` a slot before it starts each prompt group; the
buffer answers only when one more group keeps the staleness bound and fits its capacity, which
is all the pacing the three training modes need (sync = bound 0, one-step-off = 1, fully-async
= ``--max-staleness``). Each group's samples are generated concurrently, at most twice the
engines' capacity in flight (``policies.concurrency``, re-read from the router every second so
that engines joining or leaving count; ``--rollout-concurrency`` caps it), scored, filtered by
the dynamic-sampling hook, then ``put`` into the buffer — or the reservation is cancelled and
the drop counted. ``reserve`` answers with the admission version, which the put (or the
cancellation) hands back: the buffer then knows the deadline of every group still generating
and can hold a training step for a straggler (``--straggler-policy wait``). Once the prompts
are exhausted and the last group in flight is settled, the producer tells the buffer
``end_of_data``, which answers the trainer's waiting ``get``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from actors.rollout.config import RolloutConfig
from actors.rollout.data import Prompt
from actors.rollout.generate import TRAJECTORY_SESSION, GenerateContext, GenerationFailed, default_generate
from actors.rollout.hooks import load_function
from actors.rollout.rewards import RewardScorer
from actors.rollout.slime_plugins import SlimePlugins
from actors.rollout.teacher import TeacherScorer
from policies.concurrency import OVERSUBSCRIPTION, UNKNOWN_ENGINE_SLOTS, group_slots, rollout_concurrency
from policies.sampling_filters import BUILTIN_FILTERS
from slime_async import routed_experts
from slime_async.actor import Actor, ActorRef
from slime_async.exception_text import describe
from slime_async.limiter import Limiter
from slime_async.sample import Sample, Status
from slime_async.task_group import gather_or_cancel
from slime_async.trace import TraceRecorder

log = logging.getLogger(__name__)

MAX_GROUP_ATTEMPTS = 3  # a prompt whose generation keeps failing (engine errors) is dropped after this
MAX_CONSECUTIVE_FAILURES = 32  # this many failed groups in a row means no engine can serve: stop the run
CAPACITY_INTERVAL = 1.0  # seconds between two reads of the engines' capacity (the router's, no HTTP)
MIN_WAIT = 0.001  # seconds: a shorter wait for the buffer is no wait, and is left off the timeline


@dataclass
class _Window:
    """Rollout statistics since the last ``metrics()`` call."""

    rewards: list[float] = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    truncated: int = 0
    resumed: int = 0
    tokens_kept_on_abort: int = 0
    tokens: int = 0
    busy_time: float = 0.0  # seconds with at least one generation in flight
    in_flight_time: float = 0.0  # generations in flight integrated over time (their mean = this / elapsed)
    hook_metrics: dict[str, list[float]] = field(default_factory=dict)  # sample.metadata["metrics"] values
    started: float = field(default_factory=time.monotonic)


class RolloutActor(Actor):
    name = "rollout"

    def __init__(self, config: RolloutConfig, *, router: ActorRef, buffer: ActorRef, dataset: Any,
                 tokenizer: Any, vocab_size: int | None = None, name: str | None = None,
                 plugin_settings: dict[str, Any] | None = None, trace: TraceRecorder | None = None,
                 teacher: TeacherScorer | None = None):
        """``plugin_settings``: the whole run config flattened (``flatten_config``), which slime-style
        hooks read as ``args``; without it they see the rollout section only. ``trace``
        (--trace-dir): generations, rewards and the waits for room in the buffer become spans.
        ``teacher`` (--opd-type sglang): scores every training sample once it is final."""
        super().__init__(name)
        self.config = config
        self.teacher = teacher
        self.buffer = buffer
        self.dataset = dataset
        self.ctx = GenerateContext(router, tokenizer, config, vocab_size, trace=trace or TraceRecorder.off())
        # One producer waits for admission; every group task may wait to put (a pool of lanes).
        self._admission_waits = self.ctx.trace.lane("buffer", "rollout waits for admission")
        self._space_waits = self.ctx.trace.pool("buffer", "rollout waits for space")
        # Hooks of either style are wrapped into the native signatures below (hooks.hook_style).
        self.plugins = SlimePlugins(config, self.ctx, plugin_settings, concurrency=lambda: self._slots.limit)
        self.scorer = RewardScorer(config, self.ctx, self.plugins)
        self.generate_fn = default_generate
        if config.custom_generate_function_path:
            self.generate_fn = self.plugins.generate(
                load_function(config.custom_generate_function_path, "--custom-generate-function-path"))
        self._generate_takes_evaluation = "evaluation" in inspect.signature(self.generate_fn).parameters
        self.group_fn = None
        if config.rollout_function_path:
            self.group_fn = self.plugins.group(load_function(config.rollout_function_path, "--rollout-function-path"))
        self.keep_group = None
        if config.dynamic_sampling_filter_path:
            path = config.dynamic_sampling_filter_path
            self.keep_group = self.plugins.group_filter(
                BUILTIN_FILTERS.get(path) or load_function(path, "--dynamic-sampling-filter-path"))
        self._drop_reasons: Counter[str] = Counter()  # dynamic-filter drops by the filter's reason
        # Sized from the engines' capacity once the producer starts (_follow_engines).
        initial = config.rollout_concurrency or UNKNOWN_ENGINE_SLOTS
        self._slots = Limiter(initial)
        self._group_slots = Limiter(group_slots(initial, config.n_samples_per_prompt))
        # Tokens and number of the prompts started: their mean sizes a request.
        self._prompt_tokens_started = 0
        self._prompts_started = 0
        # False when the router has no engine_capacities handler (a stand-in in tests, plug-ins).
        self._capacity_known = router is not None and router.handles("engine_capacities")
        self._counters: Counter[str] = Counter()
        self._window = _Window()
        self._next_group_index = 0
        self._retry: list[tuple[Any, int]] = []  # (prompt, attempts) of groups that hit engine errors
        self._in_flight_prompts: dict[int, Any] = {}  # group index -> prompt, for checkpoints
        self._group_settled = asyncio.Event()  # set when a group leaves _in_flight_prompts
        self._producer: asyncio.Task | None = None
        self._generating = 0
        self._consecutive_failures = 0
        self._busy_since = time.monotonic()

    async def on_stop(self) -> None:
        self.scorer.close()
        if self.teacher is not None:
            await self.teacher.close()

    # ----- handlers ---------------------------------------------------------------------------
    def start(self) -> None:
        """Start producing groups (idempotent)."""
        if self._producer is None:
            self._producer = self.spawn(self._produce(), name="rollout:producer")
            self.spawn(self._follow_engines(), name="rollout:capacity")

    def sampling_params(self, *, evaluation: bool = False) -> dict[str, Any]:
        config = self.config
        params: dict[str, Any] = {
            "temperature": config.eval_temperature if evaluation else config.rollout_temperature,
            "top_p": 1.0 if evaluation else config.rollout_top_p,
            "top_k": -1 if evaluation else config.rollout_top_k,
            "max_new_tokens": (config.eval_max_response_len or config.rollout_max_response_len) if evaluation
            else config.rollout_max_response_len,
        }
        if config.rollout_stop_token_ids:
            params["stop_token_ids"] = list(config.rollout_stop_token_ids)
        return params

    def metrics(self) -> dict[str, float]:
        """``rollout/*`` scalars since the last call."""
        self._busy_change(0)  # close the open busy interval into this window
        window, self._window = self._window, _Window()
        elapsed = max(time.monotonic() - window.started, 1e-9)
        n = len(window.response_lengths)
        out = {
            "rollout/concurrency": float(self._slots.limit),
            "rollout/in_flight_mean": window.in_flight_time / elapsed,
            "rollout/concurrency_occupancy": min(1.0, window.in_flight_time / elapsed / self._slots.limit),
            "rollout/bad_rows": float(getattr(self.dataset, "bad_rows", 0)),
            "rollout/reward_errors": float(self.scorer.errors),
            "rollout/reward_timeouts": float(self.scorer.timeouts),
            "rollout/generation_errors": float(self._counters["generation_errors"]),
            "rollout/groups_filtered": float(self._counters["groups_filtered"]),
            "rollout/groups_failed": float(self._counters["groups_failed"]),
            "rollout/eval_errors": float(self._counters["eval_errors"]),
            "rollout/samples_resumed": float(window.resumed),
            "rollout/tokens_kept_on_abort": float(window.tokens_kept_on_abort),
            "rollout/tokens": float(window.tokens),
            "perf/rollout_tokens_per_s": window.tokens / elapsed,
            "perf/engine_busy_time": window.busy_time,
            "perf/engine_busy_frac": min(1.0, window.busy_time / elapsed),
        }
        out.update({f"rollout/dynamic_filter/drop_{reason}": float(count)
                    for reason, count in self._drop_reasons.items()})
        if n:
            out["rollout/reward_mean"] = sum(window.rewards) / n
            out["rollout/response_len_mean"] = sum(window.response_lengths) / n
            out["rollout/truncated_ratio"] = window.truncated / n
        if self.teacher is not None:
            out.update(self.teacher.take())
        for name, value in _means(window.hook_metrics).items():
            out.setdefault(f"rollout/{name}", value)  # a hook's name never hides a built-in metric
        return out

    def evaluate(self, datasets: Any) -> Any:
        """Score every prompt (``--n-samples-per-eval-prompt`` each) of one dataset (``eval/*``
        scalars) or of ``{name: dataset}`` (``eval/<name>/*``; name "" is ``eval/*``); a sample that
        fails is left out and counted (``failed_samples``), see ``_evaluate``."""
        return self.defer(self._evaluate_all(datasets if isinstance(datasets, dict) else {"": datasets}))

    def state_dict(self) -> dict[str, Any]:
        """The data cursor plus prompts whose groups were started but not yet in the buffer:
        a resumed run regenerates exactly those, so no prompt is skipped or repeated.

        Each pending prompt carries the group index it runs under (None for one waiting to be
        retried): a group that reaches the buffer between this snapshot and the buffer's is in
        both, and the checkpointer drops it from here by that index."""
        return {
            "dataset": self.dataset.state_dict(),
            "next_group_index": self._next_group_index,
            "pending_prompts": [{"group_index": g, "prompt": p.to_dict()} for g, p in self._in_flight_prompts.items()]
            + [{"group_index": None, "prompt": p.to_dict()} for p, _ in self._retry],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["dataset"])
        self._next_group_index = state["next_group_index"]
        self._retry = [(Prompt.from_dict(pending["prompt"]), 0) for pending in state.get("pending_prompts", [])]

    # ----- production ----------------------------------------------------------------------------
    async def _produce(self) -> None:
        await self._update_concurrency(first=True)
        while True:
            # A group slot first, then admission: the version a group is admitted at is its deadline's
            # start (the buffer may hold a step for it), so it is taken when the group can start.
            await self._group_slots.acquire()
            waited = self.ctx.trace.now()
            # The admission version: handed back with the group's put, it tells the buffer which
            # group left flight, so that a step can wait for a straggler before its deadline.
            admitted = await self.buffer.ask("reserve", timeout=None)
            # Admission: the staleness bound (or capacity) holds this group back.
            self.ctx.trace.record("wait for admission", self._admission_waits, waited, cat="buffer_wait",
                                  min_seconds=MIN_WAIT)
            prompt, attempts = self._next_prompt()
            while prompt is None and self._in_flight_prompts:
                # Data is exhausted, but a group in flight may still fail and hand its prompt back.
                self._group_settled.clear()
                await self._group_settled.wait()
                prompt, attempts = self._next_prompt()
            if prompt is None:
                self._group_slots.release()
                await self.buffer.ask("cancel_reservation", admitted=admitted)
                # Each settled group sent its put or cancellation before this (mailboxes are FIFO).
                await self.buffer.ask("end_of_data")
                log.info("rollout: prompt data exhausted")
                return
            # In flight from the moment it leaves the cursor (no await in between), so a
            # checkpoint taken at any point holds it.
            group_index = self._next_group_index
            self._next_group_index += 1
            self._in_flight_prompts[group_index] = prompt
            self._prompt_tokens_started += len(getattr(prompt, "prompt_ids", ()) or ())
            self._prompts_started += 1
            task = self.spawn(self._run_group(prompt, attempts, group_index, admitted), name="rollout:group")
            task.add_done_callback(lambda _: self._group_slots.release())

    async def _follow_engines(self) -> None:
        while self._capacity_known:
            await asyncio.sleep(CAPACITY_INTERVAL)
            await self._update_concurrency()

    async def _update_concurrency(self, first: bool = False) -> None:
        """Size the generation and group slots to what the engines hold at once (capped by
        --rollout-concurrency); a router that reports no capacities leaves them as they are.
        ``first``: wait for the router's first reads (bounded), so that the start is the same
        every run, and log the limit even if it is the initial one."""
        if not self._capacity_known:
            if first:
                log.info("rollout: %d generations in flight at most (the router reports no capacities)",
                         self._slots.limit)
            return
        # The router's own reads are bounded by --router-health-timeout; None: wait for them.
        capacities = await self.ctx.router.ask("engine_capacities", wait_for_first_read=first,
                                                timeout=None if first else 60.0)
        prompts = self._prompts_started
        per_request = (self._prompt_tokens_started // prompts if prompts else 0) + self.config.rollout_max_response_len
        limit = rollout_concurrency(capacities, per_request, cap=self.config.rollout_concurrency)
        if first or limit != self._slots.limit:
            log.info("rollout: %d generations in flight at most (%s x the engines' slots%s)", limit,
                     OVERSUBSCRIPTION, f", capped by --rollout-concurrency {self.config.rollout_concurrency}"
                     if self.config.rollout_concurrency is not None else "")
        self._slots.resize(limit)
        self._group_slots.resize(group_slots(limit, self.config.n_samples_per_prompt))

    def _next_prompt(self) -> tuple[Any, int]:
        if self._retry:
            return self._retry.pop(0)
        return self.dataset.next_prompt(), 0

    async def _run_group(self, prompt: Any, attempts: int, group_index: int, admitted: int | None) -> None:
        try:
            group = await self._generate_group(prompt, group_index)
        except Exception as error:  # noqa: BLE001 - engine and hook errors are counted and survived
            reason = self._generation_failed(error)
            self._consecutive_failures += 1
            self._settle(group_index)
            if self._consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
                # Nothing is being produced: end the run with the reason instead of spinning.
                self._counters["groups_failed"] += 1  # dropped too: its prompt is not retried
                self.fail(RuntimeError(f"{self._consecutive_failures} prompt groups in a row failed; last: {reason}"))
                return
            if attempts + 1 < MAX_GROUP_ATTEMPTS:
                log.warning("rollout: group %d failed (%s); retrying its prompt", group_index, reason)
                self._retry.append((prompt, attempts + 1))
            else:
                log.error("rollout: group %d failed %d times, dropped: %s", group_index, MAX_GROUP_ATTEMPTS, reason)
                self._counters["groups_failed"] += 1
            await self.buffer.ask("cancel_reservation", admitted=admitted)
            return
        self._consecutive_failures = 0
        for session_id in {s.session_id for s in group if s.session_id}:
            self.ctx.router.tell("end_session", session_id)  # its prefix is no longer worth keeping
        keep = await self.scorer.score_group(group)
        if keep and self.keep_group is not None:
            keep, reason = self.keep_group(group)
            if not keep:
                self._counters["groups_filtered"] += 1
                if reason:
                    self._drop_reasons[reason] += 1
        elif not keep:
            self._counters["groups_failed"] += 1
        self._settle(group_index)
        if not keep:
            await self.buffer.ask("cancel_reservation", admitted=admitted)
            return
        self._record(group)
        waited = self.ctx.trace.now()
        await self.buffer.ask("put", group, admitted=admitted, timeout=None)
        self.ctx.trace.record("wait for space", self._space_waits, waited, cat="buffer_wait", min_seconds=MIN_WAIT,
                              group=group_index)

    def _generation_failed(self, error: Exception) -> str:
        """Count a generation that raised (an engine's error answer, a hook's exception) and say
        why in one line: a hook's exception names its own frame (the user's file and line)."""
        self._counters["generation_errors"] += 1
        return describe(error)

    def _settle(self, group_index: int) -> None:
        """The group's prompt leaves flight: its group goes to the buffer, is dropped or is retried."""
        del self._in_flight_prompts[group_index]
        self._group_settled.set()

    async def _generate_group(self, prompt: Any, group_index: int) -> list[Sample]:
        samples = [self._new_sample(prompt, group_index, i) for i in range(self.config.n_samples_per_prompt)]
        params = self.sampling_params()
        try:
            if self.group_fn is not None:
                group = list(await self.group_fn(self.ctx, samples, params))
                if self.teacher is not None:
                    await gather_or_cancel(*(self.teacher.score(sample) for sample in group))
                return group
            results = await gather_or_cancel(*(self._generate_sample(sample, params) for sample in samples))
        except BaseException:
            self._forget_recordings(samples)
            raise
        return [s for result in results for s in (result if isinstance(result, list) else [result])]

    def _forget_recordings(self, samples: list[Sample]) -> None:
        # A hook that failed before collect_trajectory left its turns recorded in the router's
        # front; they would stay there until evicted (thousands of sessions of many turns).
        for sample in samples:
            session = sample.metadata.get(TRAJECTORY_SESSION)
            if session is not None:
                self.ctx.router.tell("end_session", session)

    async def _generate_sample(self, sample: Sample, params: dict[str, Any], *,
                               evaluation: bool = False) -> Sample | list[Sample]:
        max_context = self.config.rollout_max_context_len
        if max_context is not None:  # this sample's budget: what the context leaves after its prompt
            left = max_context - len(sample.tokens)
            params = {**params, "max_new_tokens": max(1, min(params["max_new_tokens"], left))}
        extra = {"evaluation": evaluation} if self._generate_takes_evaluation else {}
        async with self._slots:
            self._busy_change(+1)
            try:
                result = self.generate_fn(self.ctx, sample, params, **extra)
                if inspect.isawaitable(result):
                    result = await result
            finally:
                self._busy_change(-1)
        for s in result if isinstance(result, list) else [result]:
            s.check()
            if self.ctx.routed_layout is not None:
                try:
                    s.rollout_routed_experts = routed_experts.cover(s.rollout_routed_experts, len(s.tokens) - 1)
                except routed_experts.RoutedExpertsError as error:
                    raise GenerationFailed(f"sample {s.group_index}/{s.index}: {error}") from None
            if s.status is Status.PENDING:
                s.status = Status.COMPLETED
            if not s.response and s.response_length and self.ctx.tokenizer is not None:
                # Reward functions read the text (slime's do); decoded as the built-in rewards read it.
                s.response = self.ctx.tokenizer.decode(s.response_tokens, skip_special_tokens=True)
        if self.teacher is not None and not evaluation:
            # Final now (resumes are behind it): scored while the group's other samples generate.
            await gather_or_cancel(*(self.teacher.score(s) for s in (result if isinstance(result, list) else [result])))
        return result

    def _busy_change(self, delta: int) -> None:
        """Track the time at least one generation is in flight (the engines' busy time)."""
        now = time.monotonic()
        if self._generating > 0:
            self._window.busy_time += now - self._busy_since
            self._window.in_flight_time += self._generating * (now - self._busy_since)
        self._busy_since = now
        self._generating += delta

    def _new_sample(self, prompt: Any, group_index: int, index: int) -> Sample:
        return Sample(
            group_index=group_index,
            index=index,
            prompt=prompt.prompt,
            tokens=list(prompt.prompt_ids),
            label=prompt.label,
            # One session per group: its samples share the prompt, so one engine's prefix cache
            # serves all of them; multi-turn hooks keep it across turns.
            session_id=f"group-{group_index}",
            metadata=dict(prompt.metadata or {}),
        )

    def _record(self, group: list[Sample]) -> None:
        window = self._window
        for sample in group:
            window.rewards.append(sample.reward or 0.0)
            window.response_lengths.append(sample.response_length)
            window.truncated += sample.status is Status.TRUNCATED
            window.resumed += bool(sample.metadata.get("resumes"))
            window.tokens_kept_on_abort += sample.metadata.get("tokens_kept_on_abort", 0)
            window.tokens += sum(sample.loss_mask)
            _collect_hook_metrics(window.hook_metrics, sample)

    # ----- evaluation ------------------------------------------------------------------------------
    async def _evaluate_all(self, datasets: dict[str, Any]) -> dict[str, float]:
        try:
            results = await gather_or_cancel(*(self._evaluate(name, dataset) for name, dataset in datasets.items()))
        except Exception:
            self._counters["eval_errors"] += 1  # the asker (the loop) logs the error
            raise
        return {key: value for metrics in results for key, value in metrics.items()}

    async def _evaluate(self, name: str, dataset: Any) -> dict[str, float]:
        """One eval set. A sample whose generation raises (an engine refuses its request, a hook
        fails) or whose reward fails is counted as the training rollout counts them
        (``rollout/generation_errors``, ``rollout/reward_errors``), logged with its row, and left
        out: the set's means are over the samples that finished, ``failed_samples`` counts the rest."""
        params = self.sampling_params(evaluation=True)
        prompts = list(dataset.all_prompts())
        n = self.config.n_samples_per_eval_prompt
        prefix = f"eval/{name}/" if name else "eval/"
        label = f"eval {name!r}" if name else "eval"

        async def one(prompt: Any, i: int, k: int) -> Sample | None:
            sample = self._new_sample(prompt, -1 - i, k)
            sample.session_id = f"eval-{name}-{i}" if name else f"eval-{i}"
            try:
                result = await self._generate_sample(sample, params, evaluation=True)
            except Exception as error:  # noqa: BLE001 - one sample's failure never fails the evaluation
                log.warning("%s: row %d sample %d failed, left out: %s", label, prompt.index, k,
                            self._generation_failed(error))
                return None
            produced = result if isinstance(result, list) else [result]
            await self.scorer.score_group(produced)  # a failed reward is counted and marks the sample failed
            last = produced[-1]  # a hook that splits a trajectory is scored on its last piece
            if last.status is Status.FAILED:
                reason = last.metadata.get("reward_error")
                log.warning("%s: row %d sample %d failed, left out: %s", label, prompt.index, k,
                            f"its reward failed ({reason})" if reason else "its generate hook marked it failed")
                return None
            return last

        results = await gather_or_cancel(*(one(p, i, k) for i, p in enumerate(prompts) for k in range(n)))
        samples = [sample for sample in results if sample is not None]
        out = {prefix + "samples": float(len(samples)), prefix + "failed_samples": float(len(results) - len(samples))}
        if not samples:
            self._counters["eval_errors"] += 1  # an evaluation that measured nothing failed as a whole
            log.error("%s failed: every one of its %d samples failed (see above); no reward to report", label,
                      len(results))
            return out
        out[prefix + "reward_mean"] = sum(s.reward or 0.0 for s in samples) / len(samples)
        out[prefix + "response_len_mean"] = sum(s.response_length for s in samples) / len(samples)
        hook_metrics: dict[str, list[float]] = {}
        for sample in samples:
            _collect_hook_metrics(hook_metrics, sample)
        for name, value in _means(hook_metrics).items():
            out.setdefault(prefix + name, value)
        return out


def _collect_hook_metrics(into: dict[str, list[float]], sample: Sample) -> None:
    """A generate hook's own per-sample numbers (``sample.metadata["metrics"]``, e.g. tool calls):
    averaged over the samples that report them into ``rollout/<name>`` and ``eval/<name>``."""
    metrics = sample.metadata.get("metrics")
    if not isinstance(metrics, dict):
        return
    for name, value in metrics.items():
        if isinstance(name, str) and isinstance(value, (int, float)):
            into.setdefault(name, []).append(float(value))


def _means(values: dict[str, list[float]]) -> dict[str, float]:
    return {name: sum(v) / len(v) for name, v in values.items() if v}
