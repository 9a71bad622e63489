"""Whether the nodes that must read a directory see what another node wrote there.

The disk weight transport has trainer rank 0 write each version under the run directory and
every engine load it from the same path, which only works when that path is one filesystem
for all of them. Checked once at start with a probe file (random content) written through the
writer's node and read back through each reader's, so a run on unshared disks fails before it
trains instead of at its first weight update.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from slime_async.cluster.nodes import Node


class UnsharedDirectory(RuntimeError):
    pass


async def check_shared_directory(directory: Path, writer: Node, readers: Sequence[tuple[str, Node]], *,
                                 purpose: str, remedy: str) -> None:
    """Fail with one line naming the first reader (``(name, node)``) that does not see ``writer``'s probe."""
    token = secrets.token_hex(16)
    probe = directory / ".shared-probe"  # one file, rewritten at each start
    await writer.write_text(probe, token)
    for name, node in readers:
        if node is writer:
            continue
        seen = await node.read_text(probe)
        if seen != token:
            what = "does not exist" if seen is None else "holds other content"
            raise UnsharedDirectory(
                f"{purpose}: {name} on {node.describe()} cannot read {directory} as {writer.describe()} "
                f"writes it (the probe file {probe} {what} there); {remedy}")
