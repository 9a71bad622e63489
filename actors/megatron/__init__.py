"""The Megatron rank machinery both torchrun groups run: the policy's (`actors.trainer`) and PPO's
critic (`actors.critic`). A library, not a component: it imports no component, and both import it.

- ``config``: `TrainerConfig`, the config of a Megatron group (the trainer section).
- ``parallel``: torch.distributed + Megatron model-parallel state, CPU-safe RNG seeding.
- ``cpu_compat``: device fallbacks for megatron-core where it allocates on ``cuda`` unconditionally.
- ``attention``, ``varlen``: SDPA core attention (causal, GQA, packed sequences) for the local layer spec.
- ``model``, ``model_flags``: build a Megatron ``GPTModel`` from an HF config / directory.
- ``bridge``, ``pipeline``: HF Llama / Qwen2 / Qwen3 weights <-> Megatron GPTModel at any TP / PP.
- ``optimizer``, ``checkpoint``, ``dp_split``: DDP, optimizer and LR schedule; checkpoints; micro-
  and global batches.
- ``rank``: `MegatronRank`, what every rank does whatever its model computes.
- ``protocol``: what any rank answers over RPC (`RankInfo`, `TrainerOpError`).
- ``jit_fuser``: megatron-core's torch.compile decorator off without CUDA (it costs a CPU rank ~1.5 s of imports).
- ``worker``: the serving loop of a worker program (``-m actors.trainer.worker``, ``-m actors.critic.worker``).
"""

from actors.megatron.jit_fuser import jit_fuser_off_without_cuda

jit_fuser_off_without_cuda()  # ~1.5 s of every CPU rank's start (see the module)
