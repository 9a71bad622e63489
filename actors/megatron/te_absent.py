"""megatron-core's MoE router without Transformer Engine (checked against megatron-core 0.16.1).

``megatron.core.transformer.moe.moe_utils`` imports ``te_general_gemm`` inside a ``try`` that
swallows the ImportError, then tests ``te_general_gemm is not None`` in the router's gating
linear, which raises NameError when Transformer Engine is absent (on CPU, and on a GPU without
TE, which is how this project runs the local layer spec). Binding the missing name to ``None``
takes upstream's own no-TE branch (a plain matmul); with TE installed the name exists and
nothing is touched.
"""

from __future__ import annotations

# Names moe_utils compares with None when TE's import failed (the others are behind HAVE_TE).
_MOE_UTILS_OPTIONAL_TE_NAMES = ("te_general_gemm",)


def bind_missing_te_names() -> list[str]:
    """Set each missing optional TE name in moe_utils to None; returns the names it bound."""
    from megatron.core.transformer.moe import moe_utils

    bound = []
    for name in _MOE_UTILS_OPTIONAL_TE_NAMES:
        if not hasattr(moe_utils, name):
            setattr(moe_utils, name, None)
            bound.append(name)
    return bound
