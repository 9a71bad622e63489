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

The receiver unpickles with an allow-list (as SGLang's ``SafeUnpickler`` does): a POST body
must not be able to name arbitrary callables.
"""

from __future__ import annotations

import base64
import io
import pickle
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing

# Modules whose globals a tensor payload may reference (torch's rebuild functions and storages).
_ALLOWED_PREFIXES = ("torch.", "builtins.", "collections.", "copyreg.", "multiprocessing.reduction.")
_ALLOWED_MODULES = {"torch", "builtins", "collections", "copyreg"}
_DENIED = {("builtins", "eval"), ("builtins", "exec"), ("builtins", "compile"), ("builtins", "open"),
           ("builtins", "__import__"), ("builtins", "getattr"), ("builtins", "setattr")}


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
    if not isinstance(value, list) or not all(
            isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], torch.Tensor)
            for item in value):
        raise TensorPayloadError("expected a list of (name, tensor) pairs")
    return value


class _AllowListUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        allowed = module in _ALLOWED_MODULES or module.startswith(_ALLOWED_PREFIXES)
        if not allowed or (module, name) in _DENIED:
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
