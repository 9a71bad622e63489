"""How weights reach an engine: this component owns all of it.

- ``actor.py``: ``WeightSyncActor``, under the root supervisor; the loop asks it to ``sync(version)``.
  It quiesces the engines through the router (slime_async/quiesce.py: abort, drain, in_place,
  retract), has the transport move the weights, flushes the prefix cache where the engines can be
  idle, has the router confirm the version, and brings restarted engines back (its watcher).
- one module per ``--update-weight-transport``: ``disk.py``, ``distributed.py`` (the engine set's
  broadcast group, kept across syncs), ``tensor.py`` (IPC handles on the trainer's devices),
  ``delta.py`` (XOR against the version each engine holds);
- ``colocate.py``: the phases of a colocated step (--colocate) around the tensor transport.

Below it, what both ends import: slime_async/weights/. The trainer's half answers the messages
listed in slime_async/weights/protocol.py (actors/trainer/weight_broadcast.py and colocate.py).
"""

from actors.weight_sync.actor import WeightSyncActor
from actors.weight_sync.errors import WeightSyncError

__all__ = ["WeightSyncActor", "WeightSyncError"]
