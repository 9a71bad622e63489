"""``slime.rollout.sglang_rollout``: ``GenerateState`` and ``get_model_url`` as plug-ins use them.

slime's GenerateState is a process-wide singleton that also drives its rollout manager; a
plug-in only reads ``state.tokenizer`` and ``state.sampling_params`` from it. Here it is a
cheap view built per call: the tokenizer is the rollout's own (handed in through ``args``), or
loaded from ``args.hf_checkpoint`` when ``args`` is a plain namespace (a plug-in's unit test).
slime's rollout driver functions (``generate_rollout``, ``generate_and_rm``...) are not
provided: the rollout actor runs that loop here.
"""

from __future__ import annotations

import functools
from typing import Any

from slime_async.compat.slime.services import services_of


class GenerateState:
    def __init__(self, args: Any) -> None:
        self.args = args
        services = services_of(args)
        self.tokenizer = services.tokenizer if services is not None else _load_tokenizer(args.hf_checkpoint)
        self.processor = None  # multimodal processors are not supported
        self.sampling_params: dict[str, Any] = default_sampling_params(args)


def default_sampling_params(args: Any) -> dict[str, Any]:
    """slime's per-request defaults from ``args`` (fields left unset are not sent)."""
    params = dict(
        temperature=args.rollout_temperature,
        top_p=args.rollout_top_p,
        top_k=args.rollout_top_k,
        max_new_tokens=args.rollout_max_response_len,
        stop=getattr(args, "rollout_stop", None),
        stop_token_ids=getattr(args, "rollout_stop_token_ids", None),
        skip_special_tokens=getattr(args, "rollout_skip_special_tokens", False),
        no_stop_trim=True,  # keep the stop text: the tokens were generated and are trained
        spaces_between_special_tokens=False,
    )
    return {k: v for k, v in params.items() if v is not None}


def get_model_url(args: Any, model_name: str = "", endpoint: str = "/generate") -> str:
    """The router front's URL; one model is served, so ``model_name`` does not change it."""
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}{endpoint}"


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path: str) -> Any:
    # A memo of an immutable resource, only for plain-namespace args: loading a tokenizer per
    # call would cost seconds per sample.
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)
