"""Types that cross the RPC boundary between the supervisor and any Megatron rank (the policy's or
the critic's): who a rank is, and the error an operation raised on it.

Kept free of Megatron imports: the supervisor unpickles these without loading megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    pid: int
    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    node_ip: str = ""  # the address of the rank's node ($SLIME_NODE_IP; "" on a one-node run)

    @property
    def reports(self) -> bool:
        """Whether this rank answers for its DP shard (TP rank 0 of the last pipeline stage)."""
        return self.tp_rank == 0 and self.pp_rank == self.pp_size - 1


class TrainerOpError(RuntimeError):
    """An operation raised on a trainer rank; the message holds the rank and the traceback."""
