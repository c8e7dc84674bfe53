"""The data every collective moves, and the check of what arrived.

Rank r's element i holds ((i + r) mod 3) - 1. Every partial sum over at most 256 ranks is a
small integer, exact in float32, bfloat16 and float16, so results are compared for exact
equality and #wrong counts mismatching elements. Expected values repeat every three elements,
so an op's expectation is a few (start, length, tile) segments (ops.py), never a tensor as large
as the buffer."""

from __future__ import annotations

from typing import Any


def fill_pattern(buf: Any, rank: int, offset: int = 0) -> Any:
    """Write rank `rank`'s input elements offset..offset+len-1, ((i + rank) mod 3) - 1, into buf.

    Tiled from three values, in place: an int64 index for a 256M float32 buffer would need
    512 MiB and seconds of CPU on every prepare and check."""
    import torch

    start = offset + rank
    tile = torch.tensor([(start + j) % 3 - 1 for j in range(3)], dtype=buf.dtype, device=buf.device)
    return fill_tiled(buf, tile)


def fill_tiled(buf: Any, tile: Any) -> Any:
    count = buf.numel()
    full = count // 3 * 3
    if full:
        buf[:full].view(-1, 3).copy_(tile.expand(full // 3, 3))
    if count > full:
        buf[full:].copy_(tile[: count - full])
    return buf


def pattern(count: int, rank: int, offset: int = 0, *, dtype: Any = None, device: Any = "cpu") -> Any:
    """A new tensor holding rank `rank`'s input elements offset..offset+count-1 (see fill_pattern)."""
    import torch

    return fill_pattern(torch.empty(count, dtype=dtype, device=device), rank, offset)


def segments_tensor(
    segments: list[tuple[int, int, tuple[int, int, int]]], *, dtype: Any = None, device: Any = "cpu"
) -> Any:
    """The expected output as a tensor (for tests and small checks; the probe compares segment by
    segment without building it)."""
    import torch

    out = torch.empty(sum(length for _, length, _ in segments), dtype=dtype, device=device)
    for start, length, values in segments:
        fill_tiled(out[start : start + length], torch.tensor(values, dtype=dtype, device=device))
    return out


def count_wrong(got: Any, segments: list[tuple[int, int, tuple[int, int, int]]]) -> int:
    """Elements of `got` that differ from the expected segments. The common, correct case is
    one vectorized equality per segment against a broadcast tile, with nothing allocated."""
    import torch

    wrong = 0
    for start, length, values in segments:
        seg = got[start : start + length]
        tile = torch.tensor(values, dtype=got.dtype, device=got.device)
        full = length // 3 * 3
        head, tail = seg[:full].view(-1, 3), seg[full:]
        expected_head, expected_tail = tile.expand(full // 3, 3), tile[: length - full]
        if torch.equal(head, expected_head) and torch.equal(tail, expected_tail):
            continue
        wrong += int((head != tile).sum().item()) + int((tail != expected_tail).sum().item())
    return wrong
