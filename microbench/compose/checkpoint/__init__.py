"""A checkpoint's cost on a storage tier: bytes over bandwidth and the interval it needs (tier.py),
a full state dict gathered to rank 0 (full.py), a bucket mount's blocking and drain (mount.py)."""
