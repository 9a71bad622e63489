"""The trainer worker program: one Megatron-core rank of the policy serving `TrainerOps` over torch RPC.

    torchrun --nproc-per-node N -m actors.trainer.worker \
        --rpc-init-method tcp://127.0.0.1:PORT --rpc-world-size N+1 --config-json PATH

The serving loop is `actors.megatron.worker`'s, shared with the critic's program
(`actors.critic.worker`); the ranks join the RPC group as ``trainer<rank>``. ``call`` (the RPC
target) and ``rpc_prefix`` (the group's worker names) are what the supervisor calls them by.
"""

from __future__ import annotations

import sys
from typing import Any

# See `die_with_parent`: a spawn child of the rank (megatron-core's checkpoint writer's Manager)
# imports this module as __mp_main__ and must die with the rank. Armed before the imports below
# (torch: seconds on a busy host), while the child holds the rank's resource-tracker pipe.
if __name__ == "__mp_main__":
    from actors.megatron.parent_death import die_with_parent as _die_with_rank

    _die_with_rank()

from actors.megatron.worker import call, rpc_prefix, run

__all__ = ["call", "main", "rpc_prefix"]



def _trainer_ops(config: Any) -> Any:
    from actors.trainer.ops import TrainerOps  # megatron-core: only on the rank, not in the supervisor

    return TrainerOps(config)


def main(argv: list[str] | None = None) -> int:
    return run(argv, role="actor", build_ops=_trainer_ops, prog="actors.trainer.worker",
               description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
