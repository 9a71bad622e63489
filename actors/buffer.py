"""BufferActor: the bounded, version-aware queue of sample groups between rollout and trainer.

A group is the list of samples generated from one prompt. The rollout side talks to the buffer
in three steps per group:

    admitted = await buffer.ask("reserve", timeout=None)       # admission: may this group start now?
    ... generate and score ...
    await buffer.ask("put", group, admitted=admitted, timeout=None)  # or ask("cancel_reservation", admitted=...)

and the trainer side takes ``await buffer.ask("get", n_groups, train_version, timeout=None)``.
When the prompts run out, the rollout tells the buffer ``end_of_data`` after its last group's
put or cancellation; from then on a ``get`` that the groups left cannot fill is answered None
at once (the waiting one too), so the trainer side learns of the end without polling.

Admission control (``reserve``) is what keeps fully-async training within ``--max-staleness k``:
a reservation is granted only while one more group fits the capacity and
``policies.staleness.may_admit`` holds for pending = reserved + buffered (+ puts waiting for
space) — see that module for why this bounds the staleness of every group trained in
admission order. Whatever still ends up too old is dropped when the buffer notices it (at put,
get and set_version) and counted in ``buffer/dropped_stale``: stragglers (a group that finishes
after groups admitted later, so it is trained later than its admission slot), steps that bump
the version by more than one, a checkpoint restored into a newer run.

Stragglers (``--straggler-policy``). ``reserve`` answers with the admission version, and the
rollout hands it back with the group's ``put`` (or ``cancel_reservation``), so the buffer knows the
deadline of every group still generating. With ``wait`` (the default) a ``get`` is held back while
``policies.staleness.must_wait_for_stragglers`` says that taking the buffered groups now would
push a group still in flight past its deadline although it could have been trained: the trainer
waits for the straggler instead of training fresher groups and dropping it. With ``drop`` the
``get`` is served as soon as enough groups are buffered (the stragglers are dropped when they come).

Every waiting call is a deferred answer, so the mailbox keeps serving other messages; waiters
are served FIFO by ``_pump`` after each state change. ``reserve``, ``put`` and ``get`` must be
asked with ``timeout=None``: the buffer cannot see an asker give up, and a reservation granted
to an asker that timed out would be held forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.staleness import deadline, is_too_stale, may_admit, must_wait_for_stragglers, oldest_first, staleness
from slime_async.actor import Actor, Deferred
from slime_async.config.flags import field_help as _help
from slime_async.sample import Sample

log = logging.getLogger(__name__)

Group = list[Sample]
BufferOrder = Literal["oldest_first", "fifo"]
StragglerPolicy = Literal["wait", "drop"]


@dataclass
class BufferConfig:
    buffer_capacity: int | None = field(default=None, metadata=_help(
        "groups the buffer holds, counting groups reserved and still being generated; producers "
        "wait for space beyond it (backpressure). Unset: max(64, (staleness bound + 1) × groups per "
        "version), so that it never holds back what the bound admits (fully-async keeps k + 1 steps "
        "of groups in flight); 64 when the staleness is unbounded"))
    max_staleness: int | None = field(default=None, metadata=_help(
        "fully-async: no trained token was generated more than this many policy versions ago; new "
        "prompts wait while in-flight + buffered work would break it; none = unbounded (sync implies 0, "
        "one-step-off 1)"))
    mask_offpolicy_in_partial_rollout: bool = field(default=False, metadata=_help(
        "a partial rollout whose older tokens exceed --max-staleness keeps its newer tokens (the "
        "old ones get loss mask 0) instead of the whole group being dropped"))
    buffer_order: BufferOrder = field(default="oldest_first", metadata=_help(
        "which buffered groups a training step takes: oldest_first (the oldest generated token first: groups "
        "that finished late, e.g. behind a long-tail sample, are trained before they go stale instead of "
        "being dropped) or fifo (the order they finished in)"))
    straggler_policy: StragglerPolicy = field(default="wait", metadata=_help(
        "a group still generating whose deadline (admission version + --max-staleness) comes before a "
        "buffered group the step would take: wait (the step waits for it when it could not be trained later; "
        "nothing it starts goes stale for lack of room) or drop (the step goes ahead; the straggler is dropped "
        "as too stale when it comes, the behaviour before this flag)"))

    def validate(self) -> None:
        if self.buffer_capacity is not None and self.buffer_capacity <= 0:
            raise ValueError(f"--buffer-capacity must be > 0, got {self.buffer_capacity}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"--max-staleness must be >= 0 or none, got {self.max_staleness}")
        if self.straggler_policy == "wait" and self.buffer_order != "oldest_first":
            raise ValueError("--straggler-policy wait trains groups in deadline order: it needs --buffer-order "
                             f"oldest_first, got {self.buffer_order} (or pass --straggler-policy drop)")


@dataclass
class _Entry:
    """A buffered group with its generated-token version range, computed once at put time."""

    group: Group
    oldest: int | None
    newest: int | None

    @classmethod
    def of(cls, group: Group) -> _Entry:
        return cls(group, *_generated_versions(group))


@dataclass
class _GetWaiter:
    future: asyncio.Future
    n_groups: int
    train_version: int


@dataclass
class _PutWaiter:
    future: asyncio.Future
    entry: _Entry


class BufferActor(Actor):
    """``groups_per_step``: G of the admission rule, the groups consumed per policy version —
    ``rollout_batch_size × update_weights_interval`` when weights sync every N steps (passing
    only the batch size there would block admission until the next sync: a deadlock in sync
    mode). ``config`` is final: its ``max_staleness`` is the bound in force (``RunConfig.resolve``
    sets the one the train mode implies); ``version``: the policy version at start."""

    name = "buffer"

    def __init__(
        self,
        config: BufferConfig,
        *,
        groups_per_step: int,
        version: int = 0,
        name: str | None = None,
    ):
        super().__init__(name)
        if groups_per_step <= 0:
            raise ValueError(f"groups_per_step must be > 0, got {groups_per_step}")
        if config.buffer_capacity is None:
            # Resolved once, in RunConfig.resolve() (default_capacity); a buffer built by hand says its size.
            raise ValueError("BufferActor: buffer_capacity must be set (RunConfig.resolve() fills it in)")
        self.capacity = config.buffer_capacity
        self.max_staleness = config.max_staleness
        self.mask_offpolicy = config.mask_offpolicy_in_partial_rollout
        self.order = config.buffer_order
        # The wait rule assumes steps take the earliest deadlines first (validate() refuses wait with fifo).
        self.wait_for_stragglers = config.straggler_policy == "wait" and config.buffer_order == "oldest_first"
        self.groups_per_step = groups_per_step
        self.version = version
        # No group can be trained at an earlier version than this any more (versions only grow),
        # so a group too stale for it is too stale forever and may be dropped at once.
        self._horizon = version
        self._groups: deque[_Entry] = deque()
        self._admitted: Counter[int] = Counter()  # admission version -> reservations still generating
        self._consumed = 0
        self._taken = (version, 0)  # (train version, groups its gets took so far)
        self._straggler_holds = 0  # gets held back for a straggler (--straggler-policy wait)
        self._straggler_hold_s = 0.0
        self._held_since: float | None = None
        self._masked_out_samples = 0  # trained samples whose every token is too old (masked)
        self._dropped_groups = 0
        self._dropped_samples = 0
        self._last_staleness_max: int | None = None
        self._reserve_waiters: deque[asyncio.Future] = deque()
        self._put_waiters: deque[_PutWaiter] = deque()
        self._get_waiters: deque[_GetWaiter] = deque()
        self._data_ended = False  # the rollout will put no more groups (end_of_data)

    # ----- rollout side -----------------------------------------------------------------------
    def reserve(self) -> Deferred:
        """Answered once one more group may start (capacity and staleness bound allow it), with
        the admission version: the policy version then, which ``put`` / ``cancel_reservation``
        take back (``admitted``) so that the buffer knows which group left flight."""
        future = asyncio.get_running_loop().create_future()
        self._reserve_waiters.append(future)
        self._pump()
        return self.defer(_wait(future))

    def cancel_reservation(self, admitted: int | None = None) -> None:
        """Give back a reservation whose group will never be put (filtered, failed, no prompt);
        ``admitted``: what ``reserve`` answered (None: the oldest reservation)."""
        if self._reserved == 0:
            raise ValueError("cancel_reservation without an outstanding reservation")
        self._retire(admitted)
        self._pump()

    def put(self, group: Group, admitted: int | None = None) -> Deferred:
        """Add a group (FIFO), turning its reservation (``admitted``: what ``reserve`` answered;
        None: the oldest) into it if there is one; answered once the group is in the buffer (a put
        beyond capacity waits for a get)."""
        _check_group(group)
        if self._reserved > 0:
            self._retire(admitted)
        else:
            log.debug("buffer: put of group %s without a reservation", group[0].group_index)
        future = asyncio.get_running_loop().create_future()
        self._put_waiters.append(_PutWaiter(future, _Entry.of(group)))
        self._pump()
        return self.defer(_wait(future))

    def end_of_data(self) -> None:
        """The rollout has run out of prompts and every group it started is put or cancelled."""
        self._data_ended = True
        self._pump()

    # ----- trainer side -----------------------------------------------------------------------
    def get(self, n_groups: int, train_version: int) -> Deferred:
        """The ``n_groups`` oldest groups still within the bound at ``train_version`` (FIFO),
        answered once that many are buffered; too-stale groups are dropped and counted. None
        once the data has ended (``end_of_data``) and fewer than ``n_groups`` are left."""
        if not 0 < n_groups <= self.capacity:
            raise ValueError(
                f"get of {n_groups} groups from a buffer of capacity {self.capacity} could never be answered"
            )
        self._horizon = max(self._horizon, train_version)
        future = asyncio.get_running_loop().create_future()
        self._get_waiters.append(_GetWaiter(future, n_groups, train_version))
        self._pump()
        return self.defer(_wait(future))

    def set_version(self, version: int) -> None:
        """The policy version after a weight sync: admits more groups, may make some stale."""
        if version < self.version:
            raise ValueError(f"policy version went back from {self.version} to {version}")
        self.version = version
        self._horizon = max(self._horizon, version)
        self._pump()

    # ----- observability and checkpoint ---------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        out = {
            "buffer/size": float(len(self._groups)),
            "buffer/reserved": float(self._reserved),
            "buffer/waiting_puts": float(len(self._put_waiters)),
            "buffer/waiting_reservations": float(len(self._reserve_waiters)),
            "buffer/consumed_groups": float(self._consumed),
            "buffer/dropped_stale": float(self._dropped_groups),
            "buffer/dropped_stale_samples": float(self._dropped_samples),
            # Of the groups that reached the buffer and left it, the share thrown away as too stale.
            "buffer/dropped_stale_frac": self._dropped_groups / max(1, self._dropped_groups + self._consumed),
            # --mask-offpolicy-in-partial-rollout: trained samples of which the mask left nothing.
            "buffer/masked_out_samples": float(self._masked_out_samples),
            "buffer/straggler_holds": float(self._straggler_holds),
            "buffer/straggler_hold_s": self._straggler_hold_s + self._hold_so_far(),
            "buffer/version": float(self.version),
        }
        if self._last_staleness_max is not None:
            out["buffer/staleness_max"] = float(self._last_staleness_max)
        return out

    def state_dict(self) -> dict[str, Any]:
        """Buffered groups (and groups waiting for space) as ``Sample.to_dict()``, plus the
        counters admission depends on. Reservations are not saved: their prompts belong to the
        rollout's checkpoint and reserve again on resume."""
        groups = [e.group for e in self._groups] + [w.entry.group for w in self._put_waiters]
        return {
            "version": self.version,
            "horizon": self._horizon,
            "consumed_groups": self._consumed,
            "dropped_stale_groups": self._dropped_groups,
            "dropped_stale_samples": self._dropped_samples,
            "taken_this_version": list(self._taken),
            "groups": [[_sample_state(s) for s in group] for group in groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint into an idle buffer (no reservation, no waiting call)."""
        busy = self._reserved or self._reserve_waiters or self._put_waiters or self._get_waiters
        if busy:
            raise RuntimeError("load_state_dict on a buffer with reservations or waiting calls")
        groups = deque()
        for g, group in enumerate(state["groups"]):
            try:
                groups.append(_Entry.of([Sample.from_dict(s) for s in group]))
            except (TypeError, ValueError) as error:
                raise ValueError(f"buffer checkpoint: group {g} is not a list of samples: {error}") from error
        self.version = state["version"]
        self._horizon = max(state.get("horizon", self.version), self.version)
        self._consumed = state["consumed_groups"]
        self._dropped_groups = state["dropped_stale_groups"]
        self._dropped_samples = state["dropped_stale_samples"]
        self._taken = tuple(state.get("taken_this_version", (self.version, 0)))
        self._groups = groups
        self._pump()

    # ----- internals ----------------------------------------------------------------------------
    def _pump(self) -> None:
        """Serve waiters until nothing changes: gets first (they free space), then puts (work
        already done), then reservations (new work)."""
        progress = True
        while progress:
            self._drop_stale()
            progress = self._serve_gets() | self._serve_puts() | self._serve_reservations()

    def _serve_gets(self) -> bool:
        served = False
        while self._get_waiters:
            waiter = self._get_waiters[0]
            if waiter.future.done():  # the asker's task was cancelled (actor stopping)
                self._get_waiters.popleft()
                continue
            if len(self._groups) < waiter.n_groups:
                if not self._never_filled(waiter.n_groups):
                    break
                self._get_waiters.popleft()
                waiter.future.set_result(None)  # no more data: the loop ends instead of waiting forever
                served = True
                continue
            if self._must_wait(waiter):
                if self._held_since is None:
                    self._held_since = time.monotonic()
                    self._straggler_holds += 1
                break
            self._straggler_hold_s += self._hold_so_far()
            self._held_since = None
            self._get_waiters.popleft()
            entries = self._take(waiter.n_groups)
            self._consumed += len(entries)
            taken_version, taken = self._taken
            self._taken = (waiter.train_version, len(entries) + (taken if taken_version == waiter.train_version else 0))
            if self.mask_offpolicy and self.max_staleness is not None:
                self._masked_out_samples += sum(
                    _fully_masked(s, waiter.train_version, self.max_staleness) for e in entries for s in e.group)
            oldest = [e.oldest for e in entries if e.oldest is not None]
            if oldest:
                self._last_staleness_max = max(staleness(waiter.train_version, v) for v in oldest)
            waiter.future.set_result([e.group for e in entries])
            served = True
        return served

    def _take(self, n_groups: int) -> list[_Entry]:
        """Remove and return the ``n_groups`` groups the next step trains (``--buffer-order``)."""
        if self.order == "fifo" or self.max_staleness is None:
            return [self._groups.popleft() for _ in range(n_groups)]
        # A group with nothing generated can never go stale: it ranks as if generated now.
        chosen = set(oldest_first([self._reference(e, self.version) for e in self._groups], n_groups))
        entries = [e for i, e in enumerate(self._groups) if i in chosen]
        self._groups = deque(e for i, e in enumerate(self._groups) if i not in chosen)
        return entries

    def _serve_puts(self) -> bool:
        served = False
        while self._put_waiters and len(self._groups) < self.capacity:
            waiter = self._put_waiters.popleft()
            self._groups.append(waiter.entry)
            if not waiter.future.done():
                waiter.future.set_result(None)
            served = True
        return served

    def _serve_reservations(self) -> bool:
        served = False
        while self._reserve_waiters:
            future = self._reserve_waiters[0]
            if future.done():
                self._reserve_waiters.popleft()
                continue
            if not self._may_admit():
                break
            self._reserve_waiters.popleft()
            self._admitted[self.version] += 1
            future.set_result(self.version)
            served = True
        return served

    def _must_wait(self, waiter: _GetWaiter) -> bool:
        """--straggler-policy wait: hold this get for a group in flight (see the module docstring)."""
        if not self.wait_for_stragglers or self.max_staleness is None or not (self._admitted or self._put_waiters):
            return False
        k, t = self.max_staleness, waiter.train_version
        # Only groups that can enter the buffer before a get makes room are worth waiting for:
        # the puts that fit (served right after the gets), then the reservations behind them.
        # (Room runs out only in a buffer restored fuller than its capacity.)
        room = self.capacity - len(self._groups)
        entering = [deadline(self._reference(w.entry, self.version), k) for w in list(self._put_waiters)[:room]]
        if len(self._put_waiters) < room:
            entering += [deadline(v, k) for v, n in self._admitted.items() for _ in range(n)]
        taken_version, taken = self._taken
        return must_wait_for_stragglers(
            buffered=[deadline(self._reference(e, self.version), k) for e in self._groups], in_flight=entering,
            train_version=t, n_groups=waiter.n_groups, groups_per_version=self.groups_per_step,
            taken_this_version=taken if taken_version == t else 0)

    def _hold_so_far(self) -> float:
        return 0.0 if self._held_since is None else time.monotonic() - self._held_since

    def _retire(self, admitted: int | None) -> None:
        """One reservation leaves flight: the one admitted at ``admitted`` if there is one, else
        the oldest (a caller that does not say: the buffer then waits for no straggler it has not
        got — at worst a group is dropped as before ``--straggler-policy``)."""
        if admitted is None or not self._admitted[admitted]:
            if admitted is not None:
                log.debug("buffer: no reservation admitted at version %s; retiring the oldest", admitted)
            admitted = min(v for v, n in self._admitted.items() if n)
        self._admitted[admitted] -= 1
        if not self._admitted[admitted]:
            del self._admitted[admitted]

    @property
    def _reserved(self) -> int:
        return sum(self._admitted.values())

    def _never_filled(self, n_groups: int) -> bool:
        """No group will come any more and those buffered or waiting to enter are too few."""
        more_coming = not self._data_ended or self._reserved > 0
        return not more_coming and len(self._groups) + len(self._put_waiters) < n_groups

    def _pending(self) -> int:
        return self._reserved + len(self._groups) + len(self._put_waiters)

    def _may_admit(self) -> bool:
        pending = self._pending()
        if pending >= self.capacity:
            return False
        if self.max_staleness is None:
            return True
        return may_admit(self.version, self.max_staleness, self.groups_per_step, self._consumed, pending)

    def _drop_stale(self) -> None:
        if self.max_staleness is None:
            return
        if not any(self._is_stale(e) for e in self._groups):
            return
        kept: deque[_Entry] = deque()
        for entry in self._groups:
            if self._is_stale(entry):
                self._dropped_groups += 1
                self._dropped_samples += len(entry.group)
                # Routine off-policy (a bound of k >= 1); at 0 (sync) every group is generated on the weights
                # it trains, so a drop loses a prompt nothing else would report.
                log.log(logging.WARNING if self.max_staleness == 0 else logging.DEBUG,
                        "buffer: group %s (oldest token v%s) dropped as too stale for version %d (--max-staleness %d)",
                        entry.group[0].group_index, entry.oldest, self._horizon, self.max_staleness)
            else:
                kept.append(entry)
        self._groups = kept

    def _is_stale(self, entry: _Entry) -> bool:
        if entry.oldest is None:
            return False  # nothing generated (e.g. failed samples): nothing can be stale
        return is_too_stale(self._horizon, self._reference(entry, self._horizon), self.max_staleness)

    def _reference(self, entry: _Entry, default: int) -> int:
        """The version whose age decides whether the group is too stale (``default`` if none)."""
        # With masking, only the too-old tokens lose their loss; a group is useless (dropped)
        # only when even its newest token is too old.
        reference = entry.newest if self.mask_offpolicy else entry.oldest
        return default if reference is None else reference


def default_capacity(max_staleness: int | None, groups_per_step: int) -> int:
    """What --buffer-capacity defaults to: room for every group the staleness bound admits
    ((k + 1) × G: k steps ahead plus the one being generated for), at least 64."""
    if max_staleness is None:
        return 64
    return max(64, (max_staleness + 1) * groups_per_step)


async def _wait(future: asyncio.Future) -> Any:
    return await future


def _check_group(group: Any) -> None:
    if not isinstance(group, list) or not group:
        raise ValueError(f"put needs a non-empty list of samples, got {type(group).__name__} {group!r:.80}")
    for i, sample in enumerate(group):
        if not isinstance(sample, Sample):
            raise TypeError(f"put: group item {i} is a {type(sample).__name__}, not a Sample")


def _generated_versions(group: Group) -> tuple[int | None, int | None]:
    """(oldest, newest) policy version among the group's generated (loss_mask 1) tokens."""
    versions = [v for s in group for v, m in zip(s.token_versions, s.loss_mask) if m]
    if not versions:
        return None, None
    return min(versions), max(versions)


def _fully_masked(sample: Sample, train_version: int, max_staleness: int) -> bool:
    """A sample that had trainable tokens and whose every one is too old for ``train_version``."""
    versions = [v for v, m in zip(sample.token_versions, sample.loss_mask) if m]
    return bool(versions) and is_too_stale(train_version, max(versions), max_staleness)


def _sample_state(sample: Sample) -> dict[str, Any]:
    # Copies of the per-token lists: the checkpoint must not change if a sample does later.
    return {k: list(v) if isinstance(v, list) else v for k, v in sample.to_dict().items()}
