"""The optimizer part of colocated offload (actors/trainer/residency.py): Adam's moments and the
fp32 main params move; a model param the optimizer updates in place stays where its DDP buffer
keeps it (megatron-core's own offload_to_cpu moved it out of the buffer: the first GPU run
failed on the next export with model params on the host)."""

from __future__ import annotations

import torch

from actors.trainer.residency import HostCopies, move_optimizer_state


class _Chained:  # megatron-core's ChainedOptimizer shape: .chained_optimizers[i].optimizer
    def __init__(self, inner: torch.optim.Optimizer):
        self.chained_optimizers = [type("Megatron", (), {"optimizer": inner})()]


def test_optimizer_state_moves_and_model_params_stay():
    model_param = torch.nn.Parameter(torch.ones(3))     # a param kept in fp32: updated in place
    main_param = torch.nn.Parameter(torch.zeros(4))     # an fp32 main copy of a bf16 param
    adam = torch.optim.Adam([model_param, main_param])
    model_param.grad, main_param.grad = torch.ones(3), torch.ones(4)
    adam.step()
    # A CPU-only machine has one device; a dtype stands in for the second (tensor.to takes both).
    move_optimizer_state(_Chained(adam), [model_param], torch.float64)
    assert model_param.dtype == torch.float32 and main_param.dtype == torch.float64
    assert all(adam.state[p][key].dtype == torch.float64 for p in (model_param, main_param)
               for key in ("exp_avg", "exp_avg_sq"))
    assert adam.state[main_param]["step"].dtype == torch.float32  # the host scalar stays
    move_optimizer_state(_Chained(adam), [model_param], torch.float32)
    assert main_param.dtype == torch.float32 and adam.state[main_param]["exp_avg"].dtype == torch.float32


def test_host_copies_reuse_one_buffer_per_slot_and_keep_the_values():
    host = HostCopies(pin=False)  # pinned where CUDA runs; plain host memory here
    first = host.copy((1, "exp_avg"), torch.arange(6.0))
    again = host.copy((1, "exp_avg"), torch.full((6,), 7.0))
    assert again.data_ptr() == first.data_ptr() and again.tolist() == [7.0] * 6  # reused, overwritten
    other = host.copy((1, "exp_avg_sq"), torch.ones(2, 3, dtype=torch.bfloat16))
    assert other.data_ptr() != first.data_ptr() and other.dtype == torch.bfloat16 and other.shape == (2, 3)
    resized = host.copy((1, "exp_avg"), torch.zeros(3))
    assert resized.shape == (3,) and resized.tolist() == [0.0] * 3  # a new shape gets a new buffer
