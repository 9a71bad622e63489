"""CPU fallbacks for megatron-core: pinned targets, idempotent application, a real train step."""

from __future__ import annotations

import math

import pytest
import torch

from actors.megatron import cpu_compat
from actors.megatron.cpu_compat import CpuFallback, apply_cpu_compat, check_patch_targets

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU fallbacks apply only without CUDA")


def test_every_patch_target_still_exists_with_the_source_it_rewrites():
    problems = check_patch_targets()
    assert problems == [], (
        f"megatron-core {cpu_compat.megatron_core_version()} moved or changed functions that "
        "actors/megatron/cpu_compat.py patches; re-read them and update FALLBACKS:\n" + "\n".join(problems)
    )


def test_installed_megatron_core_is_a_version_the_fallbacks_were_tested_with():
    assert cpu_compat.megatron_core_version() in cpu_compat.TESTED_MEGATRON_CORE_VERSIONS, (
        "run the trainer tests on this megatron-core version, then add it to "
        "TESTED_MEGATRON_CORE_VERSIONS in actors/megatron/cpu_compat.py"
    )


def test_check_names_the_function_whose_source_no_longer_matches_even_after_apply():
    apply_cpu_compat()  # the check must read upstream source, not the patched copy
    moved = CpuFallback("megatron.core.transformer.utils", "get_default_causal_mask", (("device='tpu'", "x"),), "test")
    missing = CpuFallback("megatron.core.transformer.utils", "no_such_function", (("a", "b"),), "test")
    problems = check_patch_targets((moved, missing))
    assert len(problems) == 2
    assert "get_default_causal_mask" in problems[0] and "device='tpu'" in problems[0]
    assert "no_such_function" in problems[1]


def test_apply_is_idempotent_and_returns_every_active_fallback():
    first = apply_cpu_compat()
    assert first == [f.name for f in cpu_compat.FALLBACKS]
    assert apply_cpu_compat() == first


def test_patched_default_causal_mask_is_built_on_cpu():
    apply_cpu_compat()
    from megatron.core.transformer import utils

    mask = utils.get_default_causal_mask(3)
    assert mask.device.type == "cpu"
    assert mask.tolist() == [[False, True, True], [False, False, True], [False, False, False]]


@pytest.mark.timeout(300)
def test_ddp_megatron_adam_and_forward_backward_func_train_on_cpu_under_gloo(tp2_smoke):
    results = tp2_smoke
    for tp in ("tp1", "tp2"):  # tp1 = two data-parallel ranks; tp2 = one tensor-parallel pair
        run = results[tp]
        assert run["updated"] and run["params_changed"], run
        assert all(math.isfinite(x) and x > 0 for x in run["grad_norms"]), run
        # Three Adam steps on one fixed batch must lower its loss.
        assert run["losses"][-1] < run["losses"][0], run
