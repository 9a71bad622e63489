"""The PPO critic (value model): its config section, the operations its torchrun ranks serve, and
their worker program (``-m actors.critic.worker``).

The critic is a second torchrun group of Megatron ranks owned by the trainer actor
(`actors.trainer.actor.TrainerActor`, ``critic=``), supervised exactly like the policy's; what
both groups' ranks run is the library `actors.megatron`.
"""
