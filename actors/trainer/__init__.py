"""Trainer: the supervisor-side actor and the torchrun worker program of the policy's Megatron-core ranks.

- ``actor``: `TrainerActor`, the supervisor's handle on the group (and on PPO's critic group).
- ``worker``: the program each rank runs (``-m actors.trainer.worker``), serving ``ops``.
- ``ops``: `TrainerOps`, the policy's operations (train_step, compute_logprobs, save, export, ...),
  with ``logprobs`` / ``fused_logprobs`` / ``kernels`` (the LM head's logprobs and entropy),
  ``weight_sync`` (the broadcast to engines) and ``colocate`` (offload and onload).
- ``convert``: ``slime-async convert hf-to-megatron | megatron-to-hf``.

The model layer both the policy's and the critic's ranks run (model, bridge, optimizer,
checkpoints, the serving loop) is the library `actors.megatron`.
"""
