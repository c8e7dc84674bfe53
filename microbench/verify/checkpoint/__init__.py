"""Checkpoint verification: a real sharded DCP save and load (sharded.py) and a full state dict
gathered to rank 0 (full.py), each predicted from the checkpoint probe on the same target."""
