"""Rollout routing replay (R3) in the trainer's model, in one gloo process: the replayed experts are the
ones the MoE layers use (logits, a hand-routed layer), laid out per micro-batch as the model orders its
tokens, and a sample whose experts do not fit the model fails by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.megatron.routing_replay import RoutingReplay, RoutingReplayError, moe_layer_indices
from slime_async.batch import Batch

pytestmark = pytest.mark.usefixtures("single_rank_megatron")

LENGTHS = [7, 5]  # two right-padded samples


@pytest.fixture(scope="module")
def models(tiny_moe_dirs) -> dict:
    """arch -> (model, its RoutingReplay), fp32, eval mode."""
    from actors.megatron.model import build_gpt_model

    torch.manual_seed(0)
    out = {}
    for arch in ("qwen3_moe", "glm4_moe"):
        model = build_gpt_model(str(tiny_moe_dirs[arch]), load_weights=True).eval()
        out[arch] = (model, RoutingReplay(model, moe_layer_indices(model.config)))
    return out


def _tokens(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(2, 120, (len(LENGTHS), max(LENGTHS)), generator=gen)
    for b, n in enumerate(LENGTHS):
        tokens[b, n:] = 0
    return tokens, torch.arange(max(LENGTHS)).expand_as(tokens)


@torch.no_grad()
def _forward(model, routing: RoutingReplay, experts: list | None) -> torch.Tensor:
    tokens, positions = _tokens()
    routing.begin(*routing.targets(experts, LENGTHS, packed=False))
    try:
        return model(tokens, positions, None)
    finally:
        routing.end()


def _own_experts(routing: RoutingReplay) -> list[np.ndarray]:
    """Per sample the [len - 1, MoE layers, topk] experts the last (padded, sequence-first) forward chose."""
    seq, batch = max(LENGTHS), len(LENGTHS)
    per_layer = [probe.own.reshape(seq, batch, -1) for probe in routing.probes]  # probes in layer order
    grid = torch.stack(per_layer, dim=2)  # [S, B, layers, topk]
    return [grid[: n - 1, b].numpy().astype(np.int32) for b, n in enumerate(LENGTHS)]


@pytest.mark.parametrize("arch", ["qwen3_moe", "glm4_moe"])
def test_replaying_the_trainers_own_experts_gives_exactly_the_same_logits(models, arch):
    model, routing = models[arch]
    plain = _forward(model, routing, None)
    own = _own_experts(routing)
    assert torch.equal(_forward(model, routing, own), plain)
    # In another top-k order (the engine's is its own) the same up to rounding: a sigmoid router's
    # renormalisation sums the chosen scores in that order.
    reordered = _forward(model, routing, [e[..., ::-1].copy() for e in own])
    assert torch.allclose(reordered, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3_moe", "glm4_moe"])
def test_replaying_other_experts_changes_the_logits_of_those_tokens_only(models, arch):
    model, routing = models[arch]
    plain = _forward(model, routing, None)
    own = _own_experts(routing)
    other = [e.copy() for e in own]
    other[1][2] = (other[1][2] + 1) % model.config.num_moe_experts  # sample 1, position 2, every MoE layer
    logits = _forward(model, routing, other)
    # Untouched up to rounding (each expert multiplies its tokens in one matmul, whose shape changed).
    assert torch.allclose(logits[0], plain[0], rtol=0, atol=1e-5)  # sample 0
    assert torch.allclose(logits[1, :2], plain[1, :2], rtol=0, atol=1e-5)  # causal: positions before 2
    assert (logits[1, 2] - plain[1, 2]).abs().max() > 1e-2


def _hand_routed(layer, hidden: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """A Qwen3-MoE layer (renormalised softmax top-k, no shared expert) routed by ``chosen``, token by token."""
    flat = hidden.reshape(-1, hidden.size(-1))
    logits = flat @ layer.router.weight.t()
    out = torch.zeros_like(flat)
    for t in range(flat.size(0)):
        weights = torch.softmax(logits[t, chosen[t]], dim=-1)  # norm_topk_prob: softmax over the chosen
        for w, e in zip(weights, chosen[t].tolist()):
            out[t] += w * layer.experts.local_experts[e](flat[t:t + 1])[0][0]
    return out.reshape_as(hidden)


@torch.no_grad()
def test_a_replayed_moe_layer_sums_exactly_the_replayed_experts_outputs(models):
    model, routing = models["qwen3_moe"]
    moe = next(layer.mlp for layer in model.decoder.layers if hasattr(layer.mlp, "router"))
    probe = moe.router.router_replay
    hidden = torch.randn(5, 2, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    out, _ = moe(hidden)
    assert torch.allclose(out, _hand_routed(moe, hidden, probe.own), atol=1e-5)  # the reference holds
    gen = torch.Generator().manual_seed(4)
    forced = torch.stack([torch.randperm(model.config.num_moe_experts, generator=gen)[: probe.own.size(1)]
                          for _ in range(hidden.shape[0] * hidden.shape[1])])
    assert not torch.equal(forced.sort(1).values, probe.own.sort(1).values)
    probe.target = forced
    try:
        replayed, _ = moe(hidden)
    finally:
        probe.target = None
    assert torch.allclose(replayed, _hand_routed(moe, hidden, forced), atol=1e-5)
    assert (replayed - out).abs().max() > 1e-3


def test_targets_follow_the_packed_and_the_padded_token_order(models):
    _, routing = models["qwen3_moe"]
    layers, k = len(routing.moe_layers), routing.topk
    a = np.arange(2 * layers * k, dtype=np.int32).reshape(2, layers, k) % 8  # sample of 3 tokens
    targets, valid = routing.targets([a, None], [3, 2], packed=True)
    assert targets.shape == (5, layers, k) and valid.all()
    assert torch.equal(targets[:2], torch.as_tensor(a, dtype=torch.long))
    assert (targets[2:] == -1).all()  # its last token, and the sample without experts: own routing
    targets, valid = routing.targets([a, None], [3, 2], packed=False)  # [S=3, B=2] sequence first
    assert torch.equal(targets.reshape(3, 2, layers, k)[:2, 0], torch.as_tensor(a, dtype=torch.long))
    assert (targets.reshape(3, 2, layers, k)[:, 1] == -1).all()
    assert valid.tolist() == [True, True, True, True, True, False]  # row s * 2 + b; sample 1 has 2 tokens


def test_a_sample_whose_experts_do_not_fit_the_model_fails_naming_it_and_the_shapes(models):
    _, routing = models["qwen3_moe"]
    layers, k = len(routing.moe_layers), routing.topk
    wrong = np.zeros((4, layers + 1, k), dtype=np.int32)
    with pytest.raises(RoutingReplayError, match=r"sample \(7, 1\).*shape \(4, 3, 2\).*expects \(4, 2, 2\)"):
        routing.targets([None, wrong], [3, 5], packed=False, sample_ids=[(7, 0), (7, 1)])
    out_of_range = np.full((2, layers, k), 8, dtype=np.int32)
    with pytest.raises(RoutingReplayError, match=r"sample \(7, 0\).*outside \[0, 8\)"):
        routing.targets([out_of_range], [3], packed=True, sample_ids=[(7, 0)])


def test_a_batch_refuses_experts_of_another_length_naming_the_sample():
    with pytest.raises(ValueError, match=r"sample 0 \(3, 4\): rollout_routed_experts has shape \(5, 2, 2\) for 4 "
                                         r"tokens"):
        Batch(tokens=[[1, 2, 3, 4]], response_lengths=[2], loss_masks=[[1, 1]], sample_ids=[(3, 4)],
              routed_experts=[np.zeros((5, 2, 2), dtype=np.int32)])


def test_replay_is_refused_at_start_for_a_dense_model_and_with_activation_recompute(tiny_hf_dirs, tiny_moe_dirs):
    from actors.megatron.config import TrainerConfig

    with pytest.raises(ValueError, match="--use-rollout-routing-replay needs an MoE model"):
        TrainerConfig(hf_checkpoint=str(tiny_hf_dirs["qwen3"]), use_rollout_routing_replay=True).validate()
    recompute = TrainerConfig(hf_checkpoint=str(tiny_moe_dirs["qwen3_moe"]), use_rollout_routing_replay=True,
                              megatron={"recompute_granularity": "full"})
    with pytest.raises(ValueError, match="--recompute-granularity full"):
        recompute.validate()
