"""Pure decision rules of RL post-training: functions of tensors and numbers, no I/O, no state.

Modules: advantages, kl, losses, off_policy, objective (the trainer's single entry point),
loss_spec (the `LossSpec` knobs), requirements (what a spec needs computed before training),
staleness, sampling_filters, rewards, routing.
Nothing is re-exported here so that importing one rule (e.g. routing in the supervisor) does
not import torch.
"""
