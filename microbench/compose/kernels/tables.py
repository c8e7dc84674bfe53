"""Kernel efficiency tables per GPU: what a matmul, an attention pass and a memory-bound kernel
reach on that GPU at a given shape, each value from a kernel measurement with its source in the
file (data/<gpu>.json, or a table `benchmarks/kernel_tables.py` wrote on a lent GPU). Never
from step times: a published training run checks these, it does not make them.

A table is refused whole (UsageError, exit 2, naming the file and the entry) when a value is
missing, not a number, not finite or not positive: a hole would otherwise price a kernel at
zero seconds or infinity without a word.

Lookups interpolate linearly in log2 of every axis between grid points and hold the edge value
outside the grid (a shape beyond the largest measured one runs at the largest one's rate:
matmuls and attention plateau there).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import finite_number, load_json

DATA = Path(__file__).parent / "data"
ATTENTION_KEYS = ("fwd_tflops", "fwd_causal_tflops", "bwd_tflops", "bwd_causal_tflops")


@dataclass(frozen=True)
class KernelTable:
    gpu: str
    peak_bf16_tflops: float
    memory_gbps: float
    matmul_axes: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
    matmul_tflops: tuple[tuple[tuple[float, ...], ...], ...]
    attention_head_dims: tuple[float, ...]
    attention_seq_lens: tuple[float, ...]
    attention_tflops: dict[str, tuple[tuple[float, ...], ...]]   # key -> [head_dim][seq_len]
    memory_fraction: float
    sources: dict[str, str]       # kernel class -> where its values came from
    path: str

    def matmul(self, m: float, n: float, k: float) -> float:
        """TFLOP/s of one (m x k) @ (k x n) matmul."""
        return _interp3(self.matmul_axes, self.matmul_tflops, (m, n, k))

    def attention(self, seq_len: float, head_dim: float, causal: bool, backward: bool) -> float:
        key = ("bwd" if backward else "fwd") + ("_causal" if causal else "") + "_tflops"
        rows = self.attention_tflops[key]
        return _interp2(self.attention_head_dims, self.attention_seq_lens, rows, head_dim, seq_len)

    @property
    def memory_gbps_achieved(self) -> float:
        return self.memory_gbps * self.memory_fraction


def _bracket(axis: tuple[float, ...], x: float) -> tuple[int, int, float]:
    """(lower index, upper index, weight of the upper) in log2 space, clamped to the axis."""
    if x <= axis[0]:
        return 0, 0, 0.0
    if x >= axis[-1]:
        last = len(axis) - 1
        return last, last, 0.0
    hi = bisect_right(axis, x)
    lo = hi - 1
    w = (math.log2(x) - math.log2(axis[lo])) / (math.log2(axis[hi]) - math.log2(axis[lo]))
    return lo, hi, w


def _interp2(ax0: tuple[float, ...], ax1: tuple[float, ...], grid: Any, x0: float, x1: float) -> float:
    i0, j0, w0 = _bracket(ax0, x0)
    i1, j1, w1 = _bracket(ax1, x1)
    lo = grid[i0][i1] * (1 - w1) + grid[i0][j1] * w1
    hi = grid[j0][i1] * (1 - w1) + grid[j0][j1] * w1
    return lo * (1 - w0) + hi * w0


def _interp3(axes: Any, grid: Any, point: tuple[float, float, float]) -> float:
    i, j, w = _bracket(axes[0], point[0])
    lo = _interp2(axes[1], axes[2], grid[i], point[1], point[2])
    hi = _interp2(axes[1], axes[2], grid[j], point[1], point[2])
    return lo * (1 - w) + hi * w


class _Reader:
    """Reads one table file, refusing it at its first bad entry by that entry's name."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, why: str) -> UsageError:
        return UsageError(f"kernel table {self.path!r}: {where} {why}; every value must be a positive finite "
                          f"number (re-run `python benchmarks/kernel_tables.py`, or fix the file)")

    def get(self, obj: Any, key: str, where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(f"{where}.{key}".lstrip("."), "is missing")
        return obj[key]

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not finite_number(value) or value <= 0:
            raise self.fail(where, f"is {value!r}")
        return float(value)

    def axis(self, value: Any, where: str) -> tuple[float, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(where, "is missing or empty (a list of grid points)")
        out = tuple(self.number(v, f"{where}[{i}]") for i, v in enumerate(value))
        if any(b <= a for a, b in zip(out, out[1:])):
            raise self.fail(where, "is not increasing")
        return out

    def grid(self, value: Any, shape: tuple[int, ...], where: str) -> Any:
        if not shape:
            return self.number(value, where)
        if not isinstance(value, list) or len(value) != shape[0]:
            got = len(value) if isinstance(value, list) else type(value).__name__
            raise self.fail(where, f"has {got} entries, expected {shape[0]}")
        return tuple(self.grid(v, shape[1:], f"{where}[{i}]") for i, v in enumerate(value))

    def source(self, section: Any, where: str) -> str:
        text = self.get(section, "source", where)
        if not isinstance(text, str) or not text.strip():
            raise self.fail(f"{where}.source", "is empty (every value needs its source)")
        return text.strip()


def parse_table(data: Any, path: str) -> KernelTable:
    r = _Reader(path)
    if not isinstance(data, dict):
        raise r.fail("the file", f"holds a JSON {type(data).__name__}, not an object")
    gpu = r.get(data, "gpu", "")
    mm = r.get(data, "matmul", "")
    axes = tuple(r.axis(r.get(mm, a, "matmul"), f"matmul.{a}") for a in "mnk")
    grid = r.grid(r.get(mm, "tflops", "matmul"), tuple(len(a) for a in axes), "matmul.tflops")
    att = r.get(data, "attention", "")
    dims = r.axis(r.get(att, "head_dim", "attention"), "attention.head_dim")
    seqs = r.axis(r.get(att, "seq_len", "attention"), "attention.seq_len")
    attention = {key: r.grid(r.get(att, key, "attention"), (len(dims), len(seqs)), f"attention.{key}")
                 for key in ATTENTION_KEYS}
    mem = r.get(data, "memory", "")
    fraction = r.number(r.get(mem, "fraction_of_peak", "memory"), "memory.fraction_of_peak")
    if fraction > 1:
        raise r.fail("memory.fraction_of_peak", f"is {fraction!r}, more than the whole bandwidth")
    sources = {"matmul": r.source(mm, "matmul"), "attention": r.source(att, "attention"),
               "memory": r.source(mem, "memory")}
    return KernelTable(str(gpu), r.number(r.get(data, "peak_bf16_tflops", ""), "peak_bf16_tflops"),
                       r.number(r.get(data, "memory_gbps", ""), "memory_gbps"), axes, grid, dims, seqs, attention,
                       fraction, sources, path)


def load_table(path: str | Path) -> KernelTable:
    data = load_json(path, what="kernel table", expected="a kernel table (microbench/compose/kernels/data/h100.json "
                     "or one written by benchmarks/kernel_tables.py)", finite=True)
    return parse_table(data, str(path))


def shipped(gpu_name: str) -> KernelTable | None:
    """The table shipped for this GPU (a100 serves the A100's 40 and 80 GB parts), or None."""
    key = gpu_name.lower().replace("-", "").replace("_", "")
    for name in (key, key[:4]):
        path = DATA / f"{name}.json"
        if path.is_file():
            return load_table(path)
    return None
