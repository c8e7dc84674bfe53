"""The layout of a real state dict, for the checkpoint probe to mirror with synthetic data.

What a DCP load costs on S3 depends on more than the total bytes: FsspecReader reads each item
through s3fs's read-ahead cache (one 50 MiB window per miss), in the order of the loaded state
dict (dcp.load sorts its top-level keys; nested dicts keep their order), while the file holds
the items in save order (non-tensor items first, then tensors by size). Items read out of file
order, items straddling a window and replicated items that DCP stored in another rank's file each
cost another window. So a probe meant to predict the load of a model's state must have the
state's item sizes, kinds, order and top-level keys, not just its bytes.

A layout is a list of Item, in the order a walk of the state meets them (DCP's flattening order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KINDS = ("shard", "replicate", "object")


@dataclass(frozen=True)
class Item:
    group: str  # the top-level key holding it ("model", "optim"): dcp.load sorts these
    kind: str  # "shard": DTensor Shard(0) over every rank; "replicate": the same plain
    # tensor on every rank (AdamW's step); "object": a non-tensor value
    shape: tuple[int, ...] = ()  # global shape for "shard"
    dtype: str = "float32"


def shard_rows(global_rows: int, nranks: int, rank: int) -> tuple[int, int]:
    """(first row, rows) of `rank`'s Shard(0) piece, as torch.chunk splits (the last ranks may
    hold fewer, or none)."""
    chunk = -(-global_rows // nranks) if global_rows else 0
    start = min(rank * chunk, global_rows)
    return start, min(chunk, global_rows - start)


def state_layout(state: dict[str, Any]) -> list[Item]:
    """The items of a state dict in DCP's flattening order: dicts are walked in insertion order,
    lists holding tensors or dicts element by element, anything else is one object item."""
    import torch
    from torch.distributed.tensor import DTensor

    items: list[Item] = []

    def dtype_name(t: Any) -> str:
        return str(t.dtype).removeprefix("torch.")

    def walk(group: str, obj: Any) -> None:
        if isinstance(obj, DTensor):
            items.append(Item(group, "shard", tuple(obj.shape), dtype_name(obj)))
        elif isinstance(obj, torch.Tensor):
            items.append(Item(group, "replicate", tuple(obj.shape), dtype_name(obj)))
        elif isinstance(obj, dict):
            for value in obj.values():
                walk(group, value)
        elif isinstance(obj, list) and any(isinstance(v, (dict, list, torch.Tensor)) for v in obj):
            for value in obj:
                walk(group, value)
        else:
            items.append(Item(group, "object"))

    for key, value in state.items():
        walk(str(key), value)
    return items


def item_bytes(item: Item, elem: int, ranks: int) -> int:
    """Bytes the item adds to the checkpoint's size: a shard its global tensor, a replicated
    scalar once, a replicated tensor once per rank (each rank holds its own copy)."""
    if item.kind == "object":
        return 0
    numel = math.prod(item.shape)
    return numel * elem * (ranks if item.kind == "replicate" and item.shape else 1)


def layout_bytes(items: list[Item], ranks: int) -> int:
    import torch

    return sum(item_bytes(item, getattr(torch, item.dtype).itemsize, ranks) for item in items)


def tensor_count(items: list[Item]) -> int:
    return sum(1 for item in items if item.kind != "object")
