"""torch.distributed's flat-tensor collectives under one name whatever the torch release: torch
2.13 calls them all_gather_single and reduce_scatter_single, older releases only have
all_gather_into_tensor and reduce_scatter_tensor. The collective probe and verify's FSDP steps
take them from here, so a rename is followed in one place."""

from __future__ import annotations

from typing import Any


def all_gather(dist: Any) -> Any:
    """(output, input, group=None, async_op=False): every rank's input concatenated in output."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter(dist: Any) -> Any:
    """(output, input, group=None, async_op=False): this rank's chunk of the sum of the inputs."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
