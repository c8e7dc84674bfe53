"""Real FSDP2 steps and DCP checkpoints, predicted from probes and measured, with the error."""
