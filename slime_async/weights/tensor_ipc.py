"""Named tensors as IPC handles, in the payload SGLang's ``/update_weights_from_tensor`` takes.

The format is SGLang 0.5.17's ``MultiprocessingSerializer``: torch's ``ForkingPickler`` of a
list of ``(name, tensor)`` pairs, base64-encoded for JSON. The pickle holds a handle, not the
data: CUDA tensors travel as CUDA IPC handles (the receiver maps the sender's device memory),
CPU tensors as the name of a shared-memory file. The sender must keep the tensors alive until
the receiver has copied them (it answers the POST).

CPU sharing uses torch's ``file_system`` strategy: the default ``file_descriptor`` one passes
descriptors through a socket only the sender's own multiprocessing children may connect to
(an authkey), and the trainer rank and the engine are unrelated processes. The strategy is a
process-wide torch setting, set by ``serialize_named_tensors`` in the sending process.

The receiver unpickles with an allow-list of exact (module, name) pairs (stricter than SGLang's
``SafeUnpickler``, whose module prefixes let dotted names through): a POST body must not be able
to name arbitrary callables.
"""

from __future__ import annotations

import base64
import io
import pickle
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing

# The exact globals a tensor payload may reference: torch's rebuild functions (CPU shared memory,
# CUDA IPC, and SGLang's device-UUID variant of the CUDA one), storages, tensor types, dtypes and
# Size. Exact pairs, not module prefixes: protocol-4 pickles resolve dotted names, so a prefix rule
# would let ("torch.hub", "os.system") through.
_REDUCTIONS = "torch.multiprocessing.reductions"
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    *((_REDUCTIONS, name) for name in ("rebuild_tensor", "rebuild_cuda_tensor", "rebuild_typed_storage",
                                       "rebuild_typed_storage_child", "rebuild_storage_filename",
                                       "rebuild_storage_fd", "rebuild_storage_empty", "rebuild_meta_tensor")),
    ("sglang.srt.utils.patch_torch", "_rebuild_cuda_tensor_modified"),
    ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage"), ("torch", "UntypedStorage"),
    ("torch", "TypedStorage"), ("torch", "Tensor"), ("torch._tensor", "Tensor"), ("torch", "Size"),
    ("torch.nn.parameter", "Parameter"), ("collections", "OrderedDict"),
    *(("torch", name) for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype)),
})


class TensorPayloadError(ValueError):
    """A payload that is not a serialized list of (name, tensor) pairs."""


def serialize_named_tensors(named: Sequence[tuple[str, torch.Tensor]]) -> str:
    """The base64 payload of ``named`` (IPC handles; the tensors must outlive the receiver's copy)."""
    if any(t.device.type == "cpu" for _, t in named):
        torch.multiprocessing.set_sharing_strategy("file_system")
    if any(t.is_cuda for _, t in named):
        _patch_cuda_reductions()
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump([(name, tensor.detach()) for name, tensor in named])
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def deserialize_named_tensors(payload: str) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) pairs a payload names, mapped from the sender's memory (not copied)."""
    try:
        raw = base64.b64decode(payload, validate=True)
    except (ValueError, TypeError) as error:
        raise TensorPayloadError(f"not base64: {error}") from error
    try:
        value = _AllowListUnpickler(io.BytesIO(raw)).load()
    except TensorPayloadError:
        raise
    except Exception as error:  # a handle whose memory is gone fails here: FileNotFoundError, RuntimeError
        raise TensorPayloadError(f"cannot open the tensor handles: {type(error).__name__}: {error}") from error
    if not isinstance(value, list) or not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                                              and isinstance(item[1], torch.Tensor) for item in value):
        raise TensorPayloadError("expected a list of (name, tensor) pairs")
    return value


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if "." in name or (module, name) not in _ALLOWED:
            raise TensorPayloadError(f"payload references {module}.{name}, which a tensor payload may not")
        return super().find_class(module, name)


def _patch_cuda_reductions() -> None:
    """SGLang's receiver maps CUDA handles by device UUID (its processes see other
    CUDA_VISIBLE_DEVICES than the trainer's); the sender must write them the same way."""
    try:
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:  # no SGLang here: plain device indices (receivers with the same device view)
        return
    monkey_patch_torch_reductions()
