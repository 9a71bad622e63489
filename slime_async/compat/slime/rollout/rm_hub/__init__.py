"""``slime.rollout.rm_hub``: ``async_rm(args, sample)`` and ``batched_async_rm(args, samples)``.

As in slime: ``args.custom_rm_path`` when set (slime's signature, ``rm(args, sample)`` or
batched ``rm(args, samples)``), else the built-in rule ``sample.metadata["rm_type"]`` or
``args.rm_type`` on ``sample.response`` and ``sample.label``. The built-ins are this runtime's
(``--rm-type``: math, exact, f1), reached through the services the rollout put on ``args``;
slime's others (deepscaler, dapo, gpqa, ifbench, remote_rm, random) are refused by name.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from slime_async.compat.slime.services import services_of
from slime_async.compat.slime.utils.misc import load_function
from slime_async.sample import Sample
from slime_async.task_group import gather_or_cancel


async def async_rm(args: Any, sample: Sample, **kwargs: Any) -> Any:
    path = getattr(sample, "custom_rm_path", None) or getattr(args, "custom_rm_path", None)
    if path:
        return await _maybe_await(load_function(path)(args, sample, **kwargs))
    services = services_of(args)
    if services is None:
        raise RuntimeError("async_rm: built-in rewards need the args of a slime-async run (a plain namespace has none)")
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = (metadata.get("rm_type") or getattr(args, "rm_type", "") or "").strip()
    return await asyncio.to_thread(services.builtin_reward, rm_type, sample.response, sample.label)


async def batched_async_rm(args: Any, samples: list[Sample], **kwargs: Any) -> list[Any]:
    path = getattr(args, "custom_rm_path", None)
    if path:
        return list(await _maybe_await(load_function(path)(args, samples, **kwargs)))
    return await gather_or_cancel(*(async_rm(args, sample, **kwargs) for sample in samples))


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
