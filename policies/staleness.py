"""Staleness bound of fully-async training (`--max-staleness k`, AReaL style).

Policy version v = number of weight syncs so far; training step s runs at version s and ends
with a sync to s + 1. A token generated at version g and trained at version t is t − g
versions stale. A group is *admitted* (its prompt submitted to the engines) at version a, so
every token of it is generated at a version >= a (partial rollouts resumed later are only newer)
and its staleness when trained at t is at most t − a.

Admission rule. Let G = groups_per_step and number groups in the FIFO order they are admitted:
the group admitted when `consumed + pending = n` groups exist (consumed = already trained,
pending = in flight + buffered) is the n-th to be trained, so it is trained in step ⌊n / G⌋,
at version t = ⌊n / G⌋. Requiring t − a <= k gives ⌊n / G⌋ <= a + k, i.e.

    n < (a + k + 1) · G = max_admissible_groups(a, k, G)

so `may_admit` holds exactly while `consumed + pending < (version + k + 1) · G`.

Dropped groups (failed, filtered by dynamic sampling, too stale) leave `pending` without
entering `consumed`; every group behind them moves forward in the FIFO and is trained no later
than planned, so the bound still holds and the freed slot may be reused. Groups that must not
count are therefore exactly the dropped ones; counting them would only admit less. The bound
assumes each step consumes exactly G groups and each step bumps the version by one; anything
that still ends up too old (e.g. a step that consumed fewer groups) is caught by
`is_too_stale` at training time and dropped.

Stragglers. The rule also assumes groups are trained in admission order, but they finish out of
it: a group with a long-tail sample is still generating when the groups admitted after it are
done. A step that trains those instead and bumps the version moves the straggler past its
*deadline* (admission version + k, the last version that may train it), and it is dropped when it
finally arrives — generated, then thrown away. `must_wait_for_stragglers` is the rule that
prevents it (`--straggler-policy wait`): a step waits while taking the buffered groups now would
leave more groups due by some version than the steps up to that version can take. Waiting never
breaks the bound (versions only move later) and frees it from the order assumption: a group is
trained at its deadline at the latest whenever the steps up to it have room for everything due.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: the buffer's config imports this module, and the CLI's help not torch
    import torch


def max_admissible_groups(version: int, max_staleness: int, groups_per_step: int) -> int:
    """Total groups (consumed + pending) allowed to exist at `version`: (version + k + 1) · G."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    if groups_per_step <= 0:
        raise ValueError(f"groups_per_step must be > 0, got {groups_per_step}")
    return (version + max_staleness + 1) * groups_per_step


def may_admit(
    version: int,
    max_staleness: int,
    groups_per_step: int,
    consumed_groups: int,
    pending_groups: int,
) -> bool:
    """Whether one more group may be submitted now: consumed + pending < max_admissible_groups."""
    limit = max_admissible_groups(version, max_staleness, groups_per_step)
    return consumed_groups + pending_groups < limit


def deadline(version: int, max_staleness: int) -> int:
    """The last policy version that may train a token generated at ``version`` (or any token of a
    group admitted at ``version``, all of which are generated at that version or later)."""
    return version + max_staleness


def must_wait_for_stragglers(
    buffered: Sequence[int],
    in_flight: Sequence[int],
    train_version: int,
    n_groups: int,
    groups_per_version: int,
    taken_this_version: int = 0,
) -> bool:
    """Whether a step at ``train_version`` taking ``n_groups`` should wait for groups in flight.

    ``buffered`` / ``in_flight``: the deadlines (`deadline`) of the groups in the buffer and of
    those still being generated (of their admission version: a lower bound). The step would take
    the ``n_groups`` buffered groups of earliest deadline (`oldest_first`), the latest of them due
    at D. After it, the steps up to version u can take ``room(u) = (groups_per_version −
    taken_this_version − n_groups) + (u − train_version) · groups_per_version`` groups (the rest of
    this version's steps, then a whole version's each). The step waits when for some u < D more
    groups in flight are due by u than room(u): one of them will miss its deadline, and it could
    have taken the place of a group due at D had the step waited for it. Every buffered group due
    before D is in the step, so only groups in flight can be left behind that way; for u >= D
    waiting cannot help (the step is full of groups at least as urgent). Groups in flight past
    their deadline already (< ``train_version``) are lost either way and are not waited for."""
    if n_groups <= 0 or groups_per_version <= 0:
        raise ValueError(f"n_groups and groups_per_version must be > 0, got {n_groups}, {groups_per_version}")
    if len(buffered) < n_groups:
        return False  # the step cannot be served yet anyway; nothing to decide
    latest_taken = sorted(buffered)[n_groups - 1]
    urgent = sorted(d for d in in_flight if train_version <= d < latest_taken)
    room_now = max(0, groups_per_version - taken_this_version - n_groups)
    for count, due in enumerate(urgent, start=1):
        last_of_its_deadline = count == len(urgent) or urgent[count] != due
        if last_of_its_deadline and count > room_now + (due - train_version) * groups_per_version:
            return True
    return False


def staleness(train_version: int, oldest_token_version: int) -> int:
    """Versions between the oldest token of a sample and the policy that trains on it."""
    return train_version - oldest_token_version


def is_too_stale(train_version: int, oldest_token_version: int, max_staleness: int | None) -> bool:
    """True when the sample breaks the bound; max_staleness None means unbounded."""
    if max_staleness is None:
        return False
    return staleness(train_version, oldest_token_version) > max_staleness


def oldest_first(versions: Sequence[int], n_groups: int) -> list[int]:
    """Which ``n_groups`` of the buffered groups to train now: the oldest generated version
    first (ties in arrival order); indices into ``versions``, in arrival order.

    A group's deadline is its oldest token's version + k: trained at a later version it is
    dropped. Groups finish out of admission order (a long-tail sample holds its group back
    while later ones complete), so taking them in arrival order trains fresh groups first and
    lets the late ones pass their deadline: generated, then dropped. Earliest deadline first
    trains each group while it still counts; the fresh ones it defers have the most slack."""
    if n_groups < 0:
        raise ValueError(f"n_groups must be >= 0, got {n_groups}")
    chosen = sorted(range(len(versions)), key=lambda i: (versions[i], i))[:n_groups]
    return sorted(chosen)


def offpolicy_token_mask(
    token_versions: torch.Tensor, train_version: int, max_staleness: int
) -> torch.Tensor:
    """1.0 where train_version − token_version <= k, else 0.0 (--mask-offpolicy-in-partial-rollout).

    A partial rollout resumed across weight syncs mixes tokens of several versions; instead of
    dropping the whole sample, only its too-old tokens lose their loss. Multiply the result
    into loss_mask (padding positions are the caller's business).
    """
    return ((train_version - token_versions) <= max_staleness).float()
