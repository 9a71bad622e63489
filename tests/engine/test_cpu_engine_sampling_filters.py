"""top-k / top-p filtering of the CPU engine's sampler, with hand-computed expectations."""

import torch

from actors.engine.cpu.model_runner import filter_top_k_top_p


def test_top_k_keeps_exactly_k_tokens_even_when_others_tie_with_the_kth():
    out = filter_top_k_top_p(torch.tensor([0.4, 0.2, 0.2, 0.2]), top_k=2, top_p=1.0)
    assert int((out > 0).sum()) == 2
    assert out[0] == 0.4 and out.sum() == torch.tensor(0.6)


def test_top_p_keeps_the_tokens_whose_preceding_mass_is_below_p():
    # Preceding mass of the sorted tokens: 0, 0.4, 0.7, 0.9 -> the first two stay.
    out = filter_top_k_top_p(torch.tensor([0.4, 0.3, 0.2, 0.1]), top_k=-1, top_p=0.5)
    assert torch.allclose(out, torch.tensor([0.4, 0.3, 0.0, 0.0]))


def test_top_k_applies_before_top_p_which_then_sees_the_renormalised_mass():
    # top-3 leaves 0.4, 0.3, 0.2 (mass 0.9); preceding mass 0, 0.444, 0.778 of it -> 0.2 goes at p = 0.6.
    out = filter_top_k_top_p(torch.tensor([0.1, 0.4, 0.3, 0.2]), top_k=3, top_p=0.6)
    assert torch.allclose(out, torch.tensor([0.0, 0.4, 0.3, 0.0]))


def test_no_filter_leaves_the_distribution_alone():
    probs = torch.tensor([0.5, 0.25, 0.25])
    assert torch.equal(filter_top_k_top_p(probs, top_k=-1, top_p=1.0), probs)
