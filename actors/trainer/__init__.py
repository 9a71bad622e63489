"""Trainer: the supervisor-side actor and the torchrun worker program (Megatron-core ranks).

Model layer (this package's lower half):
- ``parallel``: torch.distributed + Megatron model-parallel state, CPU-safe RNG seeding.
- ``cpu_compat``: device fallbacks for megatron-core where it allocates on ``cuda`` unconditionally.
- ``attention``: SDPA core attention (causal, GQA, packed sequences) for the local layer spec.
- ``model``: build a Megatron ``GPTModel`` from an HF config / directory.
- ``bridge``: HF Llama / Qwen2 / Qwen3 weights <-> Megatron GPTModel at any TP.
- ``convert``: ``slime-async convert hf-to-megatron | megatron-to-hf``.
"""
