"""A multi-turn tool-using plug-in written the way slime's examples are (search-r1, retool),
with only its ``slime.`` imports changed to ``slime_async.compat.slime.``.

Each turn POSTs the conversation so far as *text* to the router's ``/generate`` (SGLang's native
format), appends the model's tokens with their logprobs the slime way, runs a local calculator
on the turn's text and appends its answer as a non-trainable observation. ``rm`` reads
``sample.response``. Used by tests/compat/test_slime_style_plugin.py (against a stand-in front)
and tests/e2e/test_slime_plugin_run.py (a real training run).
"""

import re
import time

from slime_async.compat.slime.rollout.sglang_rollout import GenerateState
from slime_async.compat.slime.utils.http_utils import post
from slime_async.compat.slime.utils.types import Sample

MAX_TURNS = 3
TURN_TOKENS = 8


def calculator(text: str) -> str:
    """Sum of the digits the model wrote this turn (the 'tool'); '?' when it wrote none."""
    digits = [int(c) for c in re.findall(r"\d", text)]
    return str(sum(digits)) if digits else "?"


async def generate(args, sample: Sample, sampling_params) -> Sample:
    assert not args.partial_rollout, "this plug-in does not continue partial samples"
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"

    prompt_text = sample.prompt
    sample.tokens = list(state.tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
    sample.loss_mask = []
    sample.rollout_log_probs = None
    text = prompt_text
    tool_calls = 0
    for turn in range(MAX_TURNS):
        budget = min(sampling_params["max_new_tokens"], TURN_TOKENS)
        payload = {"text": text, "sampling_params": {**sampling_params, "max_new_tokens": budget},
                   "return_logprob": True}
        output = await post(url, payload)
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        token_logprobs = output["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(
            args,
            tokens=[item[1] for item in token_logprobs],
            log_probs=[item[0] for item in token_logprobs],
            trainable=True,
            meta_info=output["meta_info"],
            text=output["text"],
        )
        text += output["text"]
        if turn == MAX_TURNS - 1:
            break
        observation = f"\n<calc>{calculator(output['text'])}</calc>\n"
        tool_calls += 1
        obs_ids = state.tokenizer(observation, add_special_tokens=False)["input_ids"]
        sample.append_response_tokens(args, tokens=obs_ids, trainable=False, text=observation)
        text += observation

    sample.tool_calls = tool_calls  # an attribute slime's Sample does not have: kept in metadata
    return sample


async def rm(args, sample: Sample, **kwargs) -> float:
    """Reward the share of digits in the model's text (the calculator's answers are not counted)."""
    if not isinstance(sample, Sample):
        raise TypeError("Sample must be an instance of Sample class.")
    model_text = re.sub(r"<calc>.*?</calc>", "", sample.response, flags=re.DOTALL)
    return sum(c.isdigit() for c in model_text) / max(1, len(model_text))


def slow_rm(args, sample):
    """A slime-style synchronous reward that takes too long (the timeout test)."""
    time.sleep(1.0)
    return 1.0
