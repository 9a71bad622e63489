"""megatron-core's ``jit_fuser`` off on a host without CUDA, before any of its modules decorates with it.

megatron-core wraps its fused activations and norms in ``torch.compile`` (``megatron.core.jit``) as
its modules are imported. The decorator alone imports TorchDynamo and Inductor's compiler: ~1.5 s of
every rank's start on CPU (Inductor; transformers imports Dynamo there anyway), where none of those
kernels runs (the fusions are off there). megatron-core's own ``disable_jit_fuser()`` makes the
decorator a no-op, but it must run between ``megatron.core.jit``'s execution and the first module
that imports ``jit_fuser``, all inside ``import megatron.core``: so the module's loader calls it
right after executing the module. With CUDA nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

JIT_MODULE = "megatron.core.jit"


def jit_fuser_off_without_cuda() -> None:
    """Install the hook (once per process; a no-op when megatron-core is imported already)."""
    if JIT_MODULE in sys.modules or any(isinstance(f, _JitFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _JitFinder())


class _JitFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None):
        if fullname != JIT_MODULE:
            return None
        sys.meta_path.remove(self)  # one module, once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _DisableAfterExec(spec.loader)
        return spec


class _DisableAfterExec(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        import torch

        if not torch.cuda.is_available():
            module.disable_jit_fuser()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: tracebacks show jit.py's lines
        return getattr(self.loader, name)
