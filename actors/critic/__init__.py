"""The PPO critic (value model): its config section and the operations its torchrun ranks serve.

The critic is a second torchrun group of Megatron ranks owned by the trainer actor
(`actors.trainer.actor.TrainerActor`, ``critic=``), supervised exactly like the policy's.
"""
