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
