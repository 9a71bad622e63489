"""Continuous-batching scheduler of the CPU engine; knows nothing of HTTP.

One dedicated thread owns every piece of scheduling state (waiting queue, running batch,
prefix cache, pause flags) and alternates between
  1. control operations posted with `call` (abort, pause, weight swap, stats ...), and
  2. one engine step: admit waiting requests (prefill each, reusing a cached prefix), then
     one batched decode over everything running.
A request that arrives while others decode therefore joins the batch at the next step,
and a finished one leaves it at once. Callers on other threads only `submit` requests and
`call` functions; results come back through each request's `on_finish` callback, invoked
on the scheduler thread.

Pause, abort and cache flush behave as SGLang 0.5.17's (see pause() and abort()); the control
requests SGLang dies on are refused or end the process (preconditions.py).

Why not transformers' continuous batching: one generation config for all requests, and a paged
cache whose prefix sharing is not reported per request; per-request sampling, `cached_tokens`,
abort with partial logprobs and SGLang's pause modes would all be bolted on.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from actors.engine.cpu.model_runner import ModelRunner, SamplingSpec, SequenceKV, slice_kv
from actors.engine.cpu.preconditions import Preconditions
from actors.engine.cpu.prefix_cache import PrefixCache
from actors.engine.cpu.protocol import SamplingParams, resolve_logprob_start_len

logger = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "retract", "in_place")
# err_type of a request refused at admission because the weights cannot serve (HTTP 503).
REFUSED = "EngineCannotServe"


@dataclass
class SchedulerConfig:
    """Memory bounds of the scheduler."""
    max_running_requests: int = 32
    # Tokens reserved by the running batch: sum of (prompt + max_new_tokens) per request.
    max_total_tokens: int = 65536
    prefix_cache_max_tokens: int = 32768

    def validate(self) -> None:
        minimums = {"max_running_requests": 1, "max_total_tokens": 1, "prefix_cache_max_tokens": 0}
        for name, minimum in minimums.items():
            if getattr(self, name) < minimum:
                raise ValueError(f"--{name.replace('_', '-')} must be at least {minimum}, got {getattr(self, name)}")


@dataclass
class Request:
    """One sequence to generate; mutated only on the scheduler thread until finished."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    on_finish: Callable[["Request"], None]
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    top_logprobs_num: int = 0
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)  # per output token
    cached_tokens: int = 0
    finish_reason: dict[str, Any] | None = None
    kv: SequenceKV | None = None  # covers input_ids + output_ids[:-1]
    # An abort that reached it while the scheduler was paused in place: it ends at continue.
    to_finish: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    generator: torch.Generator | None = None
    # (first output index, weight version) of each stretch of output_ids one version generated:
    # a request paused in place across a weight swap continues on the new weights.
    version_marks: list[tuple[int, str]] = field(default_factory=list)
    # A streamed request: called (scheduler thread) with each token that does not finish it.
    on_token: Callable[["Request", int, float], None] | None = None
    # Input positions from here on get a logprob (resolved as SGLang does; None: the default).
    logprob_start_len: int | None = None
    # SGLang's input_token_logprobs values from logprob_start_len on (the first None), from the first prefill only
    input_logprobs: list[float | None] | None = None
    return_routed_experts: bool = False  # answer with the routed experts of all_ids[:-1] (routed_experts.py)
    routed_experts: Any = None  # those, taken from the KV when it leaves the request (None: not captured)

    def __post_init__(self) -> None:
        if self.params.sampling_seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.sampling_seed)
        if self.logprob_start_len is None:
            self.logprob_start_len = resolve_logprob_start_len(-1, self.return_logprob, len(self.input_ids))

    @property
    def wants_input_logprobs(self) -> bool:
        """Whether a prefill still owes SGLang's input logprobs (positions before the last)."""
        return self.return_logprob and self.input_logprobs is None and self.logprob_start_len < len(self.input_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    def reserved_tokens(self, context_len: int) -> int:
        return min(len(self.input_ids) + self.params.max_new_tokens, context_len)


@dataclass
class SchedulerStats:
    """Counters that tests and /get_server_info read to see how batching behaved."""

    num_prefills: int = 0
    num_decode_steps: int = 0
    num_decoded_tokens: int = 0
    max_running_batch: int = 0
    num_finished: int = 0
    num_aborted: int = 0
    num_retracted: int = 0
    cache_hit_tokens: int = 0
    prompt_tokens: int = 0


class ThroughputWindow:
    """Decoded tokens per second over the last ``window_s`` seconds (SGLang's ``gen_throughput``).

    Each decode step is recorded with its start, end and token count; the rate is the tokens
    of the steps that ended inside the window over the time since the first of them started,
    so an idle engine drops to 0 once its last step leaves the window.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._steps: deque[tuple[float, float, int]] = deque()

    def add(self, started: float, ended: float, tokens: int) -> None:
        self._steps.append((started, ended, tokens))

    def rate(self, now: float) -> float:
        while self._steps and self._steps[0][1] < now - self.window_s:
            self._steps.popleft()
        if not self._steps:
            return 0.0
        return sum(tokens for _, _, tokens in self._steps) / max(now - self._steps[0][0], 1e-9)


class Scheduler:
    """Owns the scheduler thread; see the module docstring for the loop."""

    def __init__(self, runner: ModelRunner, config: SchedulerConfig,
                 refusal: Callable[[], str | None] = lambda: None, preconditions: Preconditions | None = None) -> None:
        config.validate()
        self.runner = runner
        # Why the runner cannot serve now (its memory released, weights not all loaded), or None:
        # asked before every admission, on this thread, where releases also run, so a request
        # that passed the server's early check before a release never runs on released weights.
        self.refusal = refusal
        self.config = config
        self.preconditions = preconditions or Preconditions()
        self.prefix_cache = PrefixCache(config.prefix_cache_max_tokens)
        self.stats = SchedulerStats()
        self.throughput = ThroughputWindow()
        # SGLang has two pause flags: its tokenizer's (every mode: new requests are held before the
        # scheduler, in _held here) and its scheduler's (in_place and retract: no batch is stepped).
        self.paused = False
        self.engine_paused = False
        self.pause_mode: str | None = None
        self.weight_version: str | None = None  # the label of the weights the runner holds (set_weight_version)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._held: list[Request] = []
        # SGLang's deferred /flush_cache?timeout=T: (deadline, future of (success, message)).
        self._pending_flush: tuple[float, concurrent.futures.Future] | None = None
        # A test's armed in-place pause (arm_pause_at): (output tokens, future of what it paused).
        self._pause_at: tuple[int, concurrent.futures.Future] | None = None
        self._lock = threading.Condition()
        self._incoming: list[Request] = []
        self._controls: list[tuple[Callable[[], Any], concurrent.futures.Future]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="cpu-engine-scheduler", daemon=True)

    # ---- API for other threads ---------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(timeout=30)

    def submit(self, request: Request) -> None:
        with self._lock:
            self._incoming.append(request)
            self._lock.notify()

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the scheduler thread between two steps; its result lands in the future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._stopping:
                future.set_exception(RuntimeError("scheduler is stopped"))
                return future
            self._controls.append((fn, future))
            self._lock.notify()
        return future

    # ---- control operations (run through `call`) ----------------------------------------

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """SGLang's abort: held and queued requests end now with what they have (finish type abort),
        running ones at the next step, which a scheduler paused in place does not take until
        continue_generation: until then they still run (the scheduler is not idle)."""
        reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        victims = [r for r in [*self._running, *self._waiting, *self._held] if abort_all or r.rid == rid]
        for request in victims:
            if self.engine_paused and request in self._running:
                request.to_finish = request.to_finish or reason
            else:
                self._finish(request, reason)
        return len(victims)

    def pause(self, mode: str) -> None:
        """SGLang's pause_generation; requests that arrive from now on are held until resume().

        abort:    every request ends now (abort); the scheduler itself is not paused.
        in_place: the running batch stays with its KV and is not stepped; nothing moves.
        retract:  running requests go back to the head of the waiting queue, their KV freed (not
                  cached, as SGLang's retract), and are prefilled again (prompt + tokens so far)
                  on continue. The waiting queue is then non-empty: a flush fails.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode must be one of {PAUSE_MODES}, got {mode!r}")
        self.paused, self.pause_mode = True, mode
        if mode == "abort":
            self.abort(abort_all=True)
            return
        self.engine_paused = True
        if mode == "retract":
            for request in reversed(self._running):
                if request.to_finish is not None:  # aborted while paused in place: it ends here
                    self._finish(request, request.to_finish)
                    continue
                request.kv = None
                self._waiting.appendleft(request)
                self.stats.num_retracted += 1
            self._running.clear()

    def resume(self) -> None:
        """SGLang's continue_generation: never fails; requests aborted while paused in place end
        now, held requests join the waiting queue."""
        self.paused = self.engine_paused = False
        self.pause_mode = None
        for request in [r for r in self._running if r.to_finish is not None]:
            self._finish(request, request.to_finish)
        self._waiting.extend(self._held)
        self._held.clear()

    def arm_pause_at(self, output_tokens: int) -> concurrent.futures.Future:
        """Not SGLang's (a test aid): pause in place right after the step in which a running
        request reaches ``output_tokens`` output tokens, so a weight update lands at a known token
        of a generation instead of wherever a racing client's pause would. The future gets
        ``{"rid", "output_tokens"}`` of that request. One arm at a time: a new one replaces it.
        A request gains one token per step, two in the step that admits it."""
        self.disarm_pause_at()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._pause_at = (output_tokens, future)
        return future

    def disarm_pause_at(self, future: concurrent.futures.Future | None = None) -> None:
        """Drop the armed pause (only if it is ``future``'s, when given)."""
        if self._pause_at is not None and (future is None or self._pause_at[1] is future):
            self._pause_at[1].cancel()
            self._pause_at = None

    def _check_pause_at(self) -> None:
        if self._pause_at is None or self.engine_paused:
            return
        output_tokens, future = self._pause_at
        reached = next((r for r in self._running if len(r.output_ids) >= output_tokens), None)
        if reached is None:
            return
        self._pause_at = None
        self.pause("in_place")
        if future.set_running_or_notify_cancel():
            future.set_result({"rid": reached.rid, "output_tokens": len(reached.output_ids)})

    def is_fully_idle(self) -> bool:
        """SGLang's is_fully_idle: nothing running (paused or not) and nothing waiting."""
        return not self._running and not self._waiting

    def busy(self) -> str:
        """Why the scheduler is not idle, for error messages."""
        paused = f", generation paused ({self.pause_mode})" if self.paused else ""
        return f"{len(self._running)} running and {len(self._waiting)} waiting request(s){paused}"

    def flush_cache(self) -> bool:
        """SGLang's Scheduler.flush_cache: drop the prefix cache, only when fully idle."""
        if not self.is_fully_idle():
            logger.warning("Cache not flushed because there are pending requests. #queue-req: %d, #running-req: %d",
                           len(self._waiting), len(self._running))
            return False
        self.prefix_cache.clear()
        logger.info("Cache flushed successfully!")
        return True

    def request_flush(self, timeout_s: float) -> concurrent.futures.Future:
        """SGLang's SchedulerFlushWrapper.handle: a future of (success, message). With
        ``timeout_s`` > 0 a busy scheduler defers the flush until it is idle or the deadline passes."""
        answer: concurrent.futures.Future = concurrent.futures.Future()
        if self._pending_flush is not None:
            answer.set_result((False, "Another flush_cache is already in progress."))
        elif timeout_s <= 0 or self.is_fully_idle():
            answer.set_result((self.flush_cache(), ""))
        else:
            self._pending_flush = (time.monotonic() + timeout_s, answer)
        return answer

    def swap_weights(self, staged: dict[str, torch.Tensor], flush_cache: bool, version: str | None = None) -> None:
        """Apply validated weights between two steps, so no forward mixes old and new;
        ``version`` labels them (and every later token of the requests they continue).

        ``flush_cache`` needs a fully idle scheduler, as SGLang's flush after an update asserts
        (preconditions.py): refused, or the process exits, before anything is applied.
        """
        if flush_cache and not self.is_fully_idle():
            self.preconditions.violated(
                "flush_cache_after_weight_update", AssertionError("Cache flush failed after updating weights"),
                f"flush_cache is true and the scheduler is not idle: {self.busy()}; send flush_cache false, "
                "then /flush_cache?timeout=T once it can be idle")
        self.runner.apply_weights(staged)
        if version is not None:
            self.set_weight_version(version)
        if flush_cache:
            self.flush_cache()

    def set_weight_version(self, version: str) -> None:
        """Label the weights; a request that has started continues under the new label from
        its next token (its tokens so far keep theirs)."""
        self.weight_version = version
        for request in [*self._running, *self._waiting, *self._held]:
            marks = request.version_marks
            if not marks or marks[-1][1] == version:
                continue
            if marks[-1][0] == len(request.output_ids):
                marks[-1] = (len(request.output_ids), version)  # nothing generated under the previous label
            else:
                marks.append((len(request.output_ids), version))

    def loads(self) -> dict[str, Any]:
        used = sum(len(r.input_ids) + len(r.output_ids) for r in self._running)
        incoming = len(self._incoming)  # submitted since the last step: held if paused, else queued
        return {
            "num_running_reqs": len(self._running),
            "num_waiting_reqs": len(self._waiting) + (0 if self.paused else incoming),
            "num_held_reqs": len(self._held) + (incoming if self.paused else 0),
            "fully_idle": self.is_fully_idle(),
            "flush_pending": self._pending_flush is not None,
            "num_used_tokens": used,
            "max_total_num_tokens": self.config.max_total_tokens,
            "max_running_requests": self.config.max_running_requests,
            "token_usage": round(used / self.config.max_total_tokens, 4),
            "prefix_cache_tokens": self.prefix_cache.total_tokens,
            "paused": self.paused,
            "pause_mode": self.pause_mode,
            "gen_throughput": round(self.throughput.rate(time.monotonic()), 2),
        }

    # ---- the loop -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # noqa: BLE001
            # Without its scheduler the server would answer HTTP but never generate again:
            # exit, so the supervisor sees the failure and restarts the engine.
            logger.exception("cpu engine scheduler died; exiting")
            os._exit(70)

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not (self._stopping or self._controls or self._incoming or self._has_work()
                           or self._flush_due()):
                    self._lock.wait(self._flush_wait())
                if self._stopping:
                    break
                # Held while paused, as SGLang's tokenizer holds new requests before its scheduler.
                (self._held if self.paused else self._waiting).extend(self._incoming)
                self._incoming.clear()
                controls, self._controls = self._controls, []
            for fn, future in controls:
                # A caller that gave up (HTTP client gone) cancelled its future: skip its work.
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - the caller gets the error
                    future.set_exception(exc)
            self._check_pending_flush()
            if self._has_work():
                try:
                    self._step()
                except Exception as exc:  # a failed forward fails its batch, not the engine
                    logger.exception("engine step failed")
                    for request in [*self._running]:
                        request.kv = None  # it may cover a token the ids lack: keep it out of the cache
                        self._finish(request, _abort_reason(f"engine step failed: {exc}", 500))
                self._check_pause_at()
                self._check_pending_flush()
        for request in [*self._running, *self._waiting, *self._held, *self._incoming]:
            self._finish(request, _abort_reason("engine shutting down", 503))
        for _, future in self._controls:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("scheduler is stopped"))
        if self._pending_flush is not None and not self._pending_flush[1].done():
            self._pending_flush[1].set_exception(RuntimeError("scheduler is stopped"))
        self.disarm_pause_at()

    def _has_work(self) -> bool:
        return not self.engine_paused and bool(self._running or self._waiting)

    def _flush_due(self) -> bool:
        return self._pending_flush is not None and time.monotonic() >= self._pending_flush[0]

    def _flush_wait(self) -> float | None:
        if self._pending_flush is None:
            return None
        # Capped: Condition.wait refuses a timeout as large as ?timeout=inf.
        return min(max(0.0, self._pending_flush[0] - time.monotonic()), 60.0)

    def _check_pending_flush(self) -> None:
        """SGLang's SchedulerFlushWrapper.check_pending, after every round of controls and steps."""
        if self._pending_flush is None:
            return
        deadline, answer = self._pending_flush
        if self.is_fully_idle():
            self._pending_flush = None
            result = (self.flush_cache(), "")
        elif time.monotonic() >= deadline:
            logger.warning("Deferred flush_cache timed out while waiting for idle state.")
            self._pending_flush = None
            result = (False, "Timed out waiting for idle state.")
        else:
            return
        if not answer.done():  # a caller that gave up may have cancelled it
            answer.set_result(result)

    def _step(self) -> None:
        self._admit()
        if self._running:
            self._decode()

    def _admit(self) -> None:
        refusal = self.refusal() if self._waiting else None
        if refusal is not None:
            for request in [*self._waiting]:
                self._finish(request, {"type": "abort", "message": refusal, "status_code": 503,
                                       "err_type": REFUSED})
            return
        context = self.runner.context_len
        reserved = sum(r.reserved_tokens(context) for r in self._running)
        while self._waiting and len(self._running) < self.config.max_running_requests:
            request = self._waiting[0]
            need = request.reserved_tokens(context)
            if self._running and reserved + need > self.config.max_total_tokens:
                break  # FIFO: later requests wait too, so a large one is not starved
            self._waiting.popleft()
            try:
                if self._finished_before_start(request):
                    continue
                self._prefill(request)
            except Exception as exc:  # in neither list yet: without this it would never be answered
                logger.exception("prefill of request %s failed", request.rid)
                request.kv = None
                self._finish(request, _abort_reason(f"engine step failed: {exc}", 500))
                continue
            if request.finish_reason is None:
                self._running.append(request)
                reserved += need

    def _finished_before_start(self, request: Request) -> bool:
        """A prefill-only request (max_new_tokens 0, SGLang's scoring request) ends after its
        prefill with no output token; it runs the forward only when input logprobs are wanted."""
        if request.params.max_new_tokens == 0 and not request.output_ids:
            if request.wants_input_logprobs:
                self._prefill(request, sample=False)
            self._finish(request, {"type": "length", "length": 0})
            return True
        return False

    def _prefill(self, request: Request, sample: bool = True) -> None:
        tokens = request.all_ids
        cached, prefix = self.prefix_cache.match(tokens)
        start = request.logprob_start_len
        scoring = request.wants_input_logprobs
        if scoring and cached > start:
            # As SGLang (Req.init_next_round_input): a cached prefix may not cover positions whose
            # logits the input logprobs need.
            cached, prefix = start, (slice_kv(prefix, start) if start else None)
        if not request.output_ids:  # a retracted request re-prefills; count its first visit only
            request.cached_tokens = cached
            self.stats.cache_hit_tokens += cached
            self.stats.prompt_tokens += len(tokens)
        logits, kv = self.runner.prefill(tokens, prefix, all_positions=scoring)
        if scoring:
            # logits[j] is position cached + j and predicts the token after it.
            first = start - cached
            targets = request.input_ids[start + 1:]
            # At temperature 1 whatever the request's, as SGLang's input logprobs (model_runner.py).
            scored = self.runner.token_logprobs(logits[first:first + len(targets)], targets)
            request.input_logprobs = [None, *scored]
            logits = logits[-1]
        if not request.version_marks and self.weight_version is not None:
            request.version_marks.append((0, self.weight_version))
        self.stats.num_prefills += 1
        if not request.output_ids:
            self.prefix_cache.insert(tokens, kv)  # the prompt, for the other samples of a group
        if not sample:
            return
        request.kv = kv
        token, logprob, top = self._sample(logits.unsqueeze(0), [request])
        self._append(request, token[0], logprob[0], top[0])

    def _decode(self) -> None:
        batch = list(self._running)
        self.stats.max_running_batch = max(self.stats.max_running_batch, len(batch))
        started = time.monotonic()
        logits, caches = self.runner.decode([r.output_ids[-1] for r in batch], [r.kv for r in batch])
        self.throughput.add(started, time.monotonic(), len(batch))
        self.stats.num_decode_steps += 1
        self.stats.num_decoded_tokens += len(batch)
        for request, kv in zip(batch, caches):
            request.kv = kv
        tokens, logprobs, tops = self._sample(logits, batch)
        for request, token, logprob, top in zip(batch, tokens, logprobs, tops):
            self._append(request, token, logprob, top)

    def _sample(self, logits: torch.Tensor, batch: list[Request]
                ) -> tuple[list[int], list[float], list[list[tuple[float, int]]]]:
        specs = [SamplingSpec(r.params.temperature, r.params.top_p, r.params.top_k, r.generator,
                              r.top_logprobs_num if r.return_logprob else 0) for r in batch]
        return self.runner.sample(logits, specs)

    def _append(self, request: Request, token: int, logprob: float, top: list[tuple[float, int]]) -> None:
        # Same order as SGLang's Req.check_finished: the length limit first, then stop
        # tokens; ignore_eos skips stop_token_ids as well as EOS.
        request.output_ids.append(token)
        request.output_logprobs.append(logprob)
        if request.top_logprobs_num > 0:
            request.output_top_logprobs.append(top)
        params = request.params
        if len(request.output_ids) >= params.max_new_tokens:
            self._finish(request, {"type": "length", "length": params.max_new_tokens})
        elif not params.ignore_eos and (token in params.stop_token_ids or token in self.runner.eos_token_ids):
            self._finish(request, {"type": "stop", "matched": token})
        elif len(request.input_ids) + len(request.output_ids) >= self.runner.context_len:
            # SGLang clips max_new_tokens to what the context leaves and reports that length.
            self._finish(request, {"type": "length", "length": len(request.output_ids)})
        elif request.on_token is not None:  # the finishing token comes with the answer instead
            try:
                request.on_token(request, token, logprob)
            except Exception:  # a broken callback must not take the scheduler down
                logger.exception("on_token callback failed for request %s", request.rid)

    def _finish(self, request: Request, reason: dict[str, Any]) -> None:
        if request in self._running:
            self._running.remove(request)
        elif request in self._waiting:
            self._waiting.remove(request)
        elif request in self._held:
            self._held.remove(request)
        self._release_kv(request)
        request.finish_reason = reason
        request.finished_at = time.monotonic()
        self.stats.num_finished += 1
        if reason["type"] == "abort":
            self.stats.num_aborted += 1
        try:
            request.on_finish(request)
        except Exception:  # a broken callback must not take the scheduler down
            logger.exception("on_finish callback failed for request %s", request.rid)

    def _release_kv(self, request: Request) -> None:
        """Hand a leaving sequence's KV to the prefix cache (it covers all_ids[:-1]), keeping its experts."""
        if request.kv is not None:
            request.routed_experts = getattr(request.kv, "experts", None)
            self.prefix_cache.insert(request.all_ids[:-1], request.kv)
        request.kv = None


def _abort_reason(message: str, status_code: int) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": None}
