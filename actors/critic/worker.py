"""The critic worker program: one Megatron-core rank of PPO's value model serving `CriticOps` over torch RPC.

    torchrun --nproc-per-node N -m actors.critic.worker \
        --rpc-init-method tcp://127.0.0.1:PORT --rpc-world-size W --config-json PATH \
        --rpc-rank-offset P+1

The serving loop is `actors.megatron.worker`'s, shared with the policy's program
(`actors.trainer.worker`); the ranks join the RPC group as ``critic<rank>``, after the policy's
P ranks. The trainer actor starts this group beside its own (`actors.trainer.actor`).
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

from actors.megatron.worker import run


def _critic_ops(config: Any) -> Any:
    from actors.critic.ops import CriticOps  # megatron-core: only on the rank

    return CriticOps(config)


def main(argv: list[str] | None = None) -> int:
    return run(argv, role="critic", build_ops=_critic_ops, prog="actors.critic.worker",
               description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
