"""CPU fallbacks for the few places megatron-core allocates on ``cuda`` unconditionally.

megatron-core's GPTModel (local spec), DistributedDataParallel, optimizer and schedules (with
and without pipelining) run on CPU under gloo except for a handful of hard-coded ``device="cuda"`` /
``torch.cuda.current_device()`` allocations. Everything that *can* be configured is configured
elsewhere (``use_cpu_initialization=True``, fp32, fusions off, the no-op RNG tracker in
``parallel.py``, an explicit attention mask or the SDPA core attention). What is left is
patched here, narrowly:

- each fallback names one upstream function and the exact source fragments it swaps
  (``"cuda"`` -> ``"cpu"``); the function is recompiled from its own installed source with
  only those fragments changed, in its own module's globals, so the rest of its logic is
  upstream's, not a copy that drifts;
- nothing is patched when CUDA is available, so GPU behaviour is untouched;
- ``check_patch_targets()`` verifies that every function still exists and still contains
  every fragment; ``apply_cpu_compat()`` refuses to patch if not, and warns on a
  megatron-core version this was not tested with. The test suite calls the check so an
  upgrade that moves a target fails loudly instead of silently allocating on ``cuda``.
"""

from __future__ import annotations

import importlib
import inspect
import linecache
import sys
import textwrap
import warnings
from dataclasses import dataclass
from types import FunctionType, ModuleType
from typing import Any

import torch

# megatron-core versions whose sources these fallbacks were checked against.
TESTED_MEGATRON_CORE_VERSIONS: tuple[str, ...] = ("0.16.1",)

_PATCHED_MARK = "__slime_async_cpu_compat__"

_CUR_DEV = "torch.cuda.current_device()"


@dataclass(frozen=True)
class CpuFallback:
    """One upstream function recompiled with its CUDA-only fragments swapped for CPU ones."""

    module: str  # e.g. "megatron.core.utils"
    qualname: str  # "func" or "Class.method"
    replacements: tuple[tuple[str, str], ...]  # (upstream fragment, CPU fragment)
    why: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"


FALLBACKS: tuple[CpuFallback, ...] = (
    CpuFallback(
        "megatron.core.models.common.embeddings.rotary_pos_embedding",
        "RotaryEmbedding.get_emb",
        ((_CUR_DEV, '"cpu"'),),
        "moves the CPU-initialised RoPE inverse frequencies to the current CUDA device on the "
        "first forward, with no CUDA check",
    ),
    CpuFallback(
        "megatron.core.utils",
        "GlobalMemoryBuffer.get_tensor",
        ((_CUR_DEV, '"cpu"'),),
        "the global memory buffer (unfused attention scores, sequence-parallel gathers) is "
        "always allocated on the current CUDA device",
    ),
    CpuFallback(
        "megatron.core.transformer.utils",
        "get_default_causal_mask",
        (('device="cuda"', 'device="cpu"'),),
        "the causal mask used when attention_mask is None is built on cuda",
    ),
    CpuFallback(
        "megatron.core.distributed.param_and_grad_buffer",
        "_ParamAndGradBuffer.__init__",
        ((_CUR_DEV, '"cpu"'),),
        "DistributedDataParallel's contiguous param/grad buffers are allocated on cuda",
    ),
    CpuFallback(
        "megatron.core.pipeline_parallel.schedules",
        "forward_backward_no_pipelining",
        (('torch.zeros([], dtype=torch.int, device="cuda")', 'torch.zeros([], dtype=torch.int, device="cpu")'),),
        "the no-pipelining schedule's token counter is created on cuda",
    ),
    CpuFallback(
        "megatron.core.pipeline_parallel.schedules",
        "forward_backward_pipelining_without_interleaving",
        (('torch.zeros([], dtype=torch.int, device="cuda")', 'torch.zeros([], dtype=torch.int, device="cpu")'),),
        "the pipelined (1F1B, PP > 1) schedule's token counter is created on cuda",
    ),
    CpuFallback(
        "megatron.core.pipeline_parallel.p2p_communication",
        "P2PCommunicator._communicate_shapes",
        ((_CUR_DEV, '"cpu"'), ("torch.cuda.synchronize()", "None  # cpu_compat: nothing to synchronize")),
        "pipeline stages exchange activation shapes (variable_seq_lengths) in cuda tensors and "
        "synchronize CUDA after it",
    ),
    CpuFallback(
        "megatron.core.pipeline_parallel.p2p_communication",
        "P2PCommunicator._communicate",
        ((_CUR_DEV, '"cpu"'), ("torch.cuda.synchronize()", "None  # cpu_compat: nothing to synchronize")),
        "the activations / gradients a pipeline stage receives are allocated on cuda",
    ),
    CpuFallback(
        "megatron.core.models.common.language_module.language_module",
        "LanguageModule.setup_embeddings_and_output_layer",
        (("weight.data = weight.data.cuda()", "weight.data = weight.data  # cpu_compat: stays on cpu"),),
        "with PP > 1 and tied embeddings, the last stage's copy of the embedding is moved to cuda "
        "before the first and last stages all-reduce it",
    ),
    CpuFallback(
        "megatron.core.optimizer.optimizer",
        "FP32Optimizer.__init__",
        (("device='cuda'", "device='cpu'"),),
        "the fp32 optimizer's constant loss scale tensor is created on cuda",
    ),
    CpuFallback(
        "megatron.core.optimizer.optimizer",
        "MixedPrecisionOptimizer.__init__",
        (("device='cuda'", "device='cpu'"),),
        "the bf16/fp16 optimizer's found-inf flag, overflow buffer and unit loss scale are created on cuda",
    ),
    CpuFallback(
        "megatron.core.optimizer.optimizer",
        "Float16OptimizerWithFloat16Params.__init__",
        (
            ("['torch.cuda.HalfTensor', 'torch.cuda.BFloat16Tensor']", "['torch.HalfTensor', 'torch.BFloat16Tensor']"),
            ("param.type() == 'torch.cuda.FloatTensor'", "param.type() == 'torch.FloatTensor'"),
        ),
        "the bf16/fp16 optimizer accepts only CUDA parameters (by type name)",
    ),
    CpuFallback(
        "megatron.core.optimizer.optimizer",
        "ChainedOptimizer.get_loss_scale",
        ((_CUR_DEV, '"cpu"'),),
        "an empty chained optimizer's loss scale is created on cuda",
    ),
    CpuFallback(
        "megatron.core.optimizer.clip_grads",
        "get_grad_norm_fp32",
        (("device='cuda'", "device='cpu'"),),
        "gradient-norm reduction buffers are created on cuda",
    ),
    CpuFallback(
        "megatron.core.utils",
        "local_multi_tensor_l2_norm",
        (('device="cuda"', 'device="cpu"'),),
        "the torch fallback for amp_C.multi_tensor_l2norm (used by grad clipping without Apex/TE) "
        "returns its norm on cuda",
    ),
    CpuFallback(
        "megatron.core.optimizer.clip_grads",
        "clip_grad_by_total_norm_fp32",
        (
            ("device='cuda'", "device='cpu'"),
            ("'torch.cuda.FloatTensor'", "'torch.FloatTensor'"),
        ),
        "the multi-tensor overflow flag for gradient clipping is created on cuda, and the "
        "gradients are asserted to be CUDA float tensors",
    ),
    CpuFallback(
        "megatron.core.optimizer.clip_grads",
        "count_zeros_fp32",
        (("device='cuda'", "device='cpu'"),),
        "the zero-gradient counter is created on cuda",
    ),
    CpuFallback(
        "megatron.core.dist_checkpointing.strategies.filesystem_async",
        "FileSystemWriterAsync.preload_tensors",
        (("torch.cuda.synchronize()", "None  # cpu_compat: nothing to synchronize"),),
        "dist_checkpointing.save (torch_dist) always preloads with non_blocking=True and then "
        "synchronizes CUDA",
    ),
    CpuFallback(
        "megatron.core.dist_checkpointing.strategies.state_dict_saver",
        "save_state_dict_async_finalize",
        ((_CUR_DEV, '"cpu"'),),
        "dist_checkpointing.save broadcasts its write-failure flag from a cuda tensor",
    ),
    CpuFallback(
        "megatron.core.transformer.moe.router",
        "Router.gating",
        ((_CUR_DEV, '"cpu"'),),
        "the MoE router moves its CPU weight (and bias) to the current CUDA device on every forward",
    ),
    CpuFallback(
        "megatron.core.transformer.moe.router",
        "TopKRouter.__init__",
        ((_CUR_DEV, '"cpu"'),),
        "the MoE router's expert bias and token counters (sigmoid routing with expert-bias "
        "correction, global aux loss) are created on cuda",
    ),
    CpuFallback(
        "megatron.core.tensor_parallel.layers",
        "LinearWithGradAccumulationAndAsyncCommunication.backward",
        ((_CUR_DEV, '"cpu"'),),
        "under sequence parallelism, a tensor-parallel linear layer's backward allocates the "
        "reduce-scattered input gradient on cuda",
    ),
    CpuFallback(
        "megatron.core.tensor_parallel.mappings",
        "_gather_along_last_dim",
        ((_CUR_DEV, '"cpu"'),),
        "the tensor-parallel all-gather output (gathered logits) is allocated on cuda",
    ),
    CpuFallback(
        "megatron.core.tensor_parallel.mappings",
        "_gather_along_first_dim",
        ((_CUR_DEV, '"cpu"'),),
        "the sequence-parallel all-gather output is allocated on cuda",
    ),
    CpuFallback(
        "megatron.core.tensor_parallel.mappings",
        "_reduce_scatter_along_first_dim",
        ((_CUR_DEV, '"cpu"'),),
        "the sequence-parallel reduce-scatter output is allocated on cuda",
    ),
)


def _resolve(fallback: CpuFallback) -> tuple[ModuleType, Any, str, Any]:
    """(module, owner object, attribute name, upstream function) for one fallback."""
    module = importlib.import_module(fallback.module)
    owner: Any = module
    *path, attr = fallback.qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    fn = inspect.getattr_static(owner, attr)
    return module, owner, attr, fn


def _problems_with(fallback: CpuFallback) -> list[str]:
    try:
        _, _, _, fn = _resolve(fallback)
    except (ImportError, AttributeError) as exc:
        return [f"{fallback.name}: target not found ({exc})"]
    if isinstance(fn, staticmethod):
        fn = fn.__func__
    # Once patched, the check still reads the upstream function the patch was made from.
    fn = getattr(fn, "__wrapped_upstream__", fn)
    if not isinstance(fn, FunctionType):
        return [f"{fallback.name}: expected a plain function, found {type(fn).__name__}"]
    source = inspect.getsource(fn)
    return [
        f"{fallback.name}: source no longer contains {old!r}"
        for old, _ in fallback.replacements
        if old not in source
    ]


def check_patch_targets(fallbacks: tuple[CpuFallback, ...] = FALLBACKS) -> list[str]:
    """Problems that would stop the CPU fallbacks from applying to the installed megatron-core.

    Empty when every target function exists and still contains every fragment it swaps.
    A non-empty list means megatron-core changed: re-read each named function, update
    FALLBACKS and TESTED_MEGATRON_CORE_VERSIONS.
    """
    problems: list[str] = []
    for fallback in fallbacks:
        problems.extend(_problems_with(fallback))
    return problems


def megatron_core_version() -> str:
    import megatron.core

    return str(megatron.core.__version__)


def _recompile(fallback: CpuFallback, fn: FunctionType, owner_cls: type | None) -> Any:
    """The function re-created from its patched source; a staticmethod stays a staticmethod
    because its decorator is part of the source."""
    source = textwrap.dedent(inspect.getsource(fn))
    for old, new in fallback.replacements:
        source = source.replace(old, new)
    # Wrap in a factory binding ``__class__`` so zero-argument super() keeps working for methods.
    factory_src = "def _factory(__class__):\n" + textwrap.indent(source, "    ") + (
        f"\n    return {fn.__name__}\n"
    )
    filename = f"<cpu_compat {fallback.name}>"
    linecache.cache[filename] = (len(factory_src), None, factory_src.splitlines(True), filename)
    scope: dict[str, Any] = {}
    # The globals of the innermost function: a decorator's wrapper lives in another module.
    exec(compile(factory_src, filename, "exec"), inspect.unwrap(fn).__globals__, scope)
    created = scope["_factory"](owner_cls)
    new_fn = created.__func__ if isinstance(created, staticmethod) else created
    new_fn.__qualname__ = fn.__qualname__
    new_fn.__module__ = fn.__module__
    setattr(new_fn, _PATCHED_MARK, True)
    new_fn.__wrapped_upstream__ = fn  # type: ignore[attr-defined]
    return created


def _rebind_imported_copies(old: object, new: object) -> None:
    """Point ``from module import func`` copies inside megatron at the patched function."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("megatron.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if value is old:
                setattr(module, attr, new)


def apply_cpu_compat() -> list[str]:
    """Install the CPU fallbacks when CUDA is absent; returns the names of active fallbacks.

    Idempotent: a second call patches nothing new and returns the same names. With CUDA
    available it does nothing and returns ``[]``.
    """
    if torch.cuda.is_available():
        return []
    problems = check_patch_targets()
    if problems:
        raise RuntimeError(
            f"megatron-core {megatron_core_version()} no longer matches the CPU fallbacks in "
            f"actors/megatron/cpu_compat.py (tested: {', '.join(TESTED_MEGATRON_CORE_VERSIONS)}):\n  "
            + "\n  ".join(problems)
        )
    version = megatron_core_version()
    if version not in TESTED_MEGATRON_CORE_VERSIONS:
        warnings.warn(
            f"CPU fallbacks were tested with megatron-core {TESTED_MEGATRON_CORE_VERSIONS}, "
            f"installed is {version}; targets still match, applying them anyway",
            stacklevel=2,
        )
    active: list[str] = []
    for fallback in FALLBACKS:
        module, owner, attr, fn = _resolve(fallback)
        if isinstance(fn, staticmethod):
            fn = fn.__func__
        if not getattr(fn, _PATCHED_MARK, False):
            owner_cls = owner if isinstance(owner, type) else None
            new_fn = _recompile(fallback, fn, owner_cls)
            setattr(owner, attr, new_fn)
            if owner is module:
                _rebind_imported_copies(fn, new_fn)
        active.append(fallback.name)
    return active
