"""Pure decision rules of RL post-training: functions of tensors and numbers, no I/O, no state.

Modules: advantages, kl, losses, off_policy, objective (the trainer's single entry point),
algorithm (the `AlgorithmConfig` knobs of the algorithm section), requirements (what a spec needs computed before training),
staleness, sampling_filters, rewards, routing.
Nothing is re-exported here so that importing one rule (e.g. routing in the supervisor) does
not import torch.
"""
