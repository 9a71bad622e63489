"""Delta weight sync: send each remote engine only the bits that changed since the version it holds.

codec.py (tensor bytes <-> XOR + zstd payloads, checksums), wire.py (the HTTP protocol),
receiver.py (the engine's side); the sender is the weight sync's (actors/weight_sync/delta.py).
"""
