"""The checkpoint probe's synthetic state dict: its entries (an FSDP2-like stack of row-sharded
tensors, or a given layout item by item), each element holding a known pattern so a load can be
checked element by element, and the check itself. A mixin of CheckpointProbe, which sets the
attributes declared here in its __init__."""

from __future__ import annotations

import math
from typing import Any

from .config import ROW_ELEMS, Config, layout
from .dcp_errors import _local
from .state_layout import Item, shard_rows, tensor_count

PATTERN_PERIOD = 251  # values 0..250 are exact in float32, bfloat16 and float16


class SyntheticState:
    # Set by CheckpointProbe.__init__.
    config: Config
    torch: Any
    elem: int
    n: int
    rank: int
    device: Any
    mesh: Any
    entries: list[tuple[str | None, str, Item]]
    state: dict[str, Any]

    def _entries(self) -> list[tuple[str | None, str, Item]]:
        """(top-level key or None, key, item) for each entry of the state dict, in its order."""
        if self.config.items:
            return [(item.group, f"{i:05d}", item) for i, item in enumerate(self.config.items)]
        rows = layout(self.config.size_bytes, self.n, self.elem, self.config.tensors)
        # Zero-padded: dcp.load reads top-level keys sorted, dcp.save writes them in insertion
        # order; "layers.10" sorting before "layers.2" made S3 loads read out of file order.
        width = len(str(len(rows) - 1))
        head: list[tuple[str | None, str, Item]] = [(None, "step", Item("", "object"))]
        return head + [
            (None, f"layers.{i:0{width}d}.weight", Item("", "shard", (r * self.n, ROW_ELEMS), self.config.dtype))
            for i, r in enumerate(rows)
        ]

    def _pattern(self, index: int, first: int, count: int, dtype: Any) -> Any:
        """Element e of entry `index` (global flat position first + e) holds
        (first + e + 7 * index) mod PATTERN_PERIOD: one period tiled in the target dtype (an int64
        arange and modulo over 128 MiB took seconds)."""
        torch = self.torch
        offset = (first + 7 * index) % PATTERN_PERIOD
        period = torch.arange(PATTERN_PERIOD, dtype=torch.float32).to(dtype)
        tiled = period.repeat(-(-(count + offset) // PATTERN_PERIOD))[offset : offset + count]
        # clone: its own storage, exactly the shard (a view would carry the whole tiled buffer).
        return tiled.clone().to(self.device)

    def _leaf(self, index: int, item: Item, fill: bool) -> Any:
        from torch.distributed.tensor import DTensor, Shard

        torch = self.torch
        if item.kind == "object":
            return 1000 + index if fill else 0
        dtype = getattr(torch, item.dtype)
        if item.kind == "replicate":
            count, first, shape = math.prod(item.shape), 0, item.shape
        else:
            start, rows = shard_rows(item.shape[0], self.n, self.rank)
            inner = math.prod(item.shape[1:])
            count, first, shape = rows * inner, start * inner, (rows, *item.shape[1:])
        local = (
            self._pattern(index, first, count, dtype) if fill else torch.zeros(count, dtype=dtype, device=self.device)
        ).view(shape)
        if item.kind == "replicate":
            return local
        stride = tuple(math.prod(item.shape[d + 1 :]) for d in range(len(item.shape)))
        return DTensor.from_local(
            local, self.mesh, [Shard(0)], run_check=False, shape=torch.Size(item.shape), stride=stride
        )

    def _make_state(self, fill: bool) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for index, (group, key, item) in enumerate(self.entries):
            holder = state if group is None else state.setdefault(group, {})
            holder[key] = self._leaf(index, item, fill)
        return state

    def _zero(self, state: dict[str, Any]) -> None:
        for group, key, item in self.entries:
            holder = state if group is None else state[group]
            if item.kind == "object":
                holder[key] = 0
            else:
                _local(holder[key]).zero_()

    def _count_wrong(self, state: dict[str, Any]) -> int:
        # self.state holds the pattern (remade after async_save's scribble test), so it is the
        # reference: regenerating the pattern cost ~1 s per check for 128 MiB per rank.
        wrong = 0
        for group, key, item in self.entries:
            got = (state if group is None else state[group])[key]
            want = (self.state if group is None else self.state[group])[key]
            if item.kind == "object":
                wrong += int(got != want)
                continue
            got, want = _local(got), _local(want)
            if not self.torch.equal(got, want):
                wrong += int((got != want).sum().item())
        return wrong

    @property
    def tensors(self) -> int:
        return tensor_count([item for _g, _k, item in self.entries])
