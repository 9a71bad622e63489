"""The optimizer part of colocated offload (actors/trainer/colocate.py): Adam's moments and the
fp32 main params move; a model param the optimizer updates in place stays where its DDP buffer
keeps it (megatron-core's own offload_to_cpu moved it out of the buffer: the first GPU run
failed on the next export with model params on the host)."""

from __future__ import annotations

import torch

from actors.trainer.colocate import move_optimizer_state


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
