"""The formats weights travel in, which both ends import (the weight sync in actors/weight_sync/,
the trainer ranks in actors/trainer/, the CPU engine in actors/engine/cpu/):

- ``protocol.py``: the update group's spec and tensor metadata, and the trainer's messages;
- ``process_group.py``: a broadcast group beside torchrun's default one (SGLang's convention);
- ``flat_bucket.py``: SGLang's ``flattened_bucket`` layout (one broadcast per bucket);
- ``tensor_ipc.py``: IPC handles for ``update_weights_from_tensor`` (CUDA IPC / shared memory);
- ``delta/``: XOR + zstd payloads, their wire protocol and the engine-side receiver.
"""
