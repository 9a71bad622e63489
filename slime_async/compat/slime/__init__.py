"""slime's plug-in API, for plug-ins written against THUDM's slime.

A slime plug-in runs with its ``slime.`` imports changed to ``slime_async.compat.slime.``::

    from slime_async.compat.slime.rollout.sglang_rollout import GenerateState
    from slime_async.compat.slime.utils.http_utils import post
    from slime_async.compat.slime.utils.types import Sample

The modules mirror slime's paths and hold only what plug-ins import: data types
(``Sample``, ``DynamicFilterOutput``, the rollout-function outputs), the HTTP helpers
(``post``, ``get``), ``GenerateState``, ``load_function``, and the reward / filter entry points
of ``rm_hub`` and ``filter_hub``. This package is part of the runtime, so it imports no
component: where a slime entry point needs one (the tokenizer, the built-in rewards), the
rollout's adapter (``actors/rollout/slime_plugins.py``) hands it in through ``args``.
"""
