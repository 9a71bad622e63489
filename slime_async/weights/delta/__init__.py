"""Delta weight sync: send each remote engine only the bits that changed since the version it holds.

codec.py (tensor bytes <-> XOR + zstd payloads, checksums), wire.py (the HTTP protocol),
sender.py (the trainer's side), receiver.py (the engine's side).
"""
