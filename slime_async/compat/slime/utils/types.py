"""``slime.utils.types``: ``Sample`` is the runtime's own, which answers to slime's names."""

from slime_async.sample import Sample, Status

__all__ = ["Sample", "Status"]
