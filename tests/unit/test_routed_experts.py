"""Routed experts from SGLang's wire form to the sample's layout, through the generation loop and
buffer checkpoints (slime_async/routed_experts.py, slime_async/generation.py). Engines are scripted
here; tests/engine/test_cpu_engine_routed_experts.py runs the real CPU engine."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from slime_async.generation import CompletionSpec, GenerationFailed, complete
from slime_async.routed_experts import RoutedExpertsError, RoutedLayout, cover, routed_layout
from slime_async.sample import Sample

# 3 layers, the middle one dense (Qwen3-MoE mlp_only_layers=[1]), top-2.
LAYOUT = RoutedLayout(num_layers=3, top_k=2, moe_layers=(0, 2))


def wire(positions: int, first_id: int = 0) -> tuple[str, np.ndarray]:
    """SGLang's base64 of [positions, 3, 2] int32 (dense layer 1 zeros), and the [positions, 2, 2]
    the runtime keeps of it."""
    full = (np.arange(positions * 6, dtype=np.int32).reshape(positions, 3, 2) + first_id) % 8
    full[:, 1] = 0
    return base64.b64encode(full.tobytes()).decode(), full[:, [0, 2]]


def answer(tokens: list[int], finish: str, routed: str | None) -> dict:
    meta = {"output_token_logprobs": [[-0.5, t, None] for t in tokens], "finish_reason": {"type": finish}}
    if routed is not None:
        meta["routed_experts"] = routed
    return {"meta_info": meta}


class Engine:
    """Answers in turn; records what each request asked for."""

    def __init__(self, answers: list[dict]):
        self.answers, self.requests = list(answers), []

    async def send(self, input_ids: list[int], params: dict, **extra) -> dict:
        self.requests.append((list(input_ids), extra))
        return self.answers.pop(0)


@pytest.mark.parametrize(("config", "expected"), [
    (dict(model_type="qwen3_moe", num_hidden_layers=4, num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1]),
     RoutedLayout(4, 2, (0, 2, 3))),
    (dict(model_type="qwen3_moe", num_hidden_layers=4, num_experts=8, num_experts_per_tok=3, decoder_sparse_step=2),
     RoutedLayout(4, 3, (1, 3))),
    (dict(model_type="glm4_moe", num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=4,
          first_k_dense_replace=1), RoutedLayout(4, 4, (1, 2, 3))),
    (dict(model_type="qwen3", num_hidden_layers=4), None),
])
def test_the_moe_layers_follow_the_hf_config(config, expected):
    assert routed_layout(config) == expected


def test_decode_keeps_only_the_moe_layers_of_sglangs_array():
    encoded, kept = wire(5)
    decoded = LAYOUT.decode(encoded, 5)
    assert decoded.dtype == np.int32 and decoded.shape == (5, 2, 2)
    np.testing.assert_array_equal(decoded, kept)


def test_decode_refuses_an_array_of_the_wrong_size_naming_the_counts():
    encoded, _ = wire(5)
    with pytest.raises(RoutedExpertsError, match=r"holds 30 ids; 4 positions x 3 layers x top-2 need 24"):
        LAYOUT.decode(encoded, 4)


async def test_a_resumed_completion_keeps_the_latest_answer_which_covers_every_position():
    first, _ = wire(4)  # prompt [1, 2, 3] + 2 tokens, the last not fed
    second, kept = wire(6, first_id=3)  # resumed: [1, 2, 3, 10, 11] + 2 tokens
    engine = Engine([answer([10, 11], "abort", first), answer([12, 13], "length", second)])
    out = await complete(engine.send, CompletionSpec([1, 2, 3], {}, 4, routed=LAYOUT), None)

    assert engine.requests == [([1, 2, 3], {"return_routed_experts": True}),
                               ([1, 2, 3, 10, 11], {"return_routed_experts": True})]
    assert out.output_ids == [10, 11, 12, 13]
    np.testing.assert_array_equal(out.routed_experts, kept)  # 3 + 4 - 1 positions


async def test_an_abort_before_the_prefill_keeps_the_experts_so_far():
    first, kept = wire(4)
    engine = Engine([answer([10, 11], "abort", first), answer([], "abort", None), answer([], "length", None)])
    out = await complete(engine.send, CompletionSpec([1, 2, 3], {}, 2, routed=LAYOUT), None)
    np.testing.assert_array_equal(out.routed_experts, kept)


async def test_a_text_stop_cuts_the_experts_with_the_tokens():
    routed, kept = wire(6)
    engine = Engine([answer([10, 11, 12, 13], "length", routed)])
    decode = {10: "a", 11: "b", 12: "X", 13: "c"}
    spec = CompletionSpec([1, 2, 3], {}, 8, stop=("X",), chunk_tokens=4, routed=LAYOUT)
    out = await complete(engine.send, spec, lambda ids: "".join(decode[i] for i in ids))
    assert out.output_ids == [10, 11, 12]
    np.testing.assert_array_equal(out.routed_experts, kept[:5])


async def test_an_answer_without_routed_experts_fails_naming_the_server_flag():
    engine = Engine([answer([10], "stop", None)])
    with pytest.raises(GenerationFailed, match="--enable-return-routed-experts"):
        await complete(engine.send, CompletionSpec([1, 2, 3], {}, 4, routed=LAYOUT), None)


def test_trailing_tokens_no_forward_fed_get_rows_and_too_many_rows_are_refused():
    _, kept = wire(4)
    covered = cover(kept, 6)
    assert covered.shape == (6, 2, 2)
    np.testing.assert_array_equal(covered[:4], kept)
    assert not covered[4:].any()
    with pytest.raises(RoutedExpertsError, match="cover 4 positions, the sample has only 3"):
        cover(kept, 3)
    with pytest.raises(RoutedExpertsError, match="ctx.generate_turn"):
        cover(None, 3)


def test_a_buffer_checkpoint_keeps_a_samples_routed_experts():
    _, kept = wire(4)
    sample = Sample(group_index=0, index=0, tokens=[1, 2, 3, 4, 5], response_length=2, loss_mask=[1, 1],
                    rollout_logprobs=[-1.0, -1.0], token_versions=[0, 0], rollout_routed_experts=kept)
    # As the run checkpoint writes the buffer (actors/loop/run_checkpoint.py) and reads it back.
    restored = Sample.from_dict(orjson.loads(orjson.dumps(sample.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY)))
    assert restored.rollout_routed_experts.dtype == np.int32
    np.testing.assert_array_equal(restored.rollout_routed_experts, kept)
    assert Sample.from_dict(orjson.loads(orjson.dumps(Sample().to_dict()))).rollout_routed_experts is None
