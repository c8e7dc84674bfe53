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

Attention is tabulated per implementation (FlashAttention-2, FlashAttention-1, the Triton
FlashAttention kernel, or whatever a measured table's SDPA ran), each with its own source: the
same FLOPs run at very different rates on one GPU. `overlap` holds the share of its rate compute
keeps while a collective runs beside it (NCCL's CTAs hold whole SMs), on one node and across
nodes; a table without it says so and prices no contention.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import finite_number, load_json

DATA = Path(__file__).parent / "data"
ATTENTION_KEYS = ("fwd_tflops", "fwd_causal_tflops", "bwd_tflops", "bwd_causal_tflops")


@dataclass(frozen=True)
class AttentionTable:
    """One attention implementation's rates: key -> [head_dim][seq_len] TFLOP/s."""
    name: str
    head_dims: tuple[float, ...]
    seq_lens: tuple[float, ...]
    tflops: dict[str, tuple[tuple[float, ...], ...]]
    source: str

    def rate(self, seq_len: float, head_dim: float, causal: bool, backward: bool) -> float:
        key = ("bwd" if backward else "fwd") + ("_causal" if causal else "") + "_tflops"
        return _interp2(self.head_dims, self.seq_lens, self.tflops[key], head_dim, seq_len)


@dataclass(frozen=True)
class KernelTable:
    gpu: str
    peak_bf16_tflops: float
    memory_gbps: float
    matmul_axes: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]
    matmul_tflops: tuple[tuple[tuple[float, ...], ...], ...]
    attention_impls: dict[str, AttentionTable]
    default_attention: str
    memory_fraction: float
    sources: dict[str, str]       # kernel class -> where its values came from
    path: str
    overlap_rates: dict[str, float] | None = None   # "one_node" / "multi_node" -> compute's share of its rate

    def matmul(self, m: float, n: float, k: float) -> float:
        """TFLOP/s of one (m x k) @ (k x n) matmul."""
        return _interp3(self.matmul_axes, self.matmul_tflops, (m, n, k))

    def attention_impl(self, impl: str | None = None) -> AttentionTable:
        """The implementation asked for, or the table's default when it is None or not tabulated
        (`has_attention` tells which; the caller says so)."""
        return self.attention_impls.get(impl or self.default_attention) or self.attention_impls[self.default_attention]

    def has_attention(self, impl: str | None) -> bool:
        return impl is None or impl in self.attention_impls

    def attention(
        self, seq_len: float, head_dim: float, causal: bool, backward: bool, impl: str | None = None
    ) -> float:
        return self.attention_impl(impl).rate(seq_len, head_dim, causal, backward)

    def overlap_rate(self, multi_node: bool) -> float:
        """The share of its rate compute keeps while a collective runs beside it (1: not tabulated)."""
        if not self.overlap_rates:
            return 1.0
        return self.overlap_rates["multi_node" if multi_node else "one_node"]

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
        if any(b <= a for a, b in pairwise(out)):
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


def _attention_impl(r: _Reader, section: Any, name: str, where: str) -> AttentionTable:
    dims = r.axis(r.get(section, "head_dim", where), f"{where}.head_dim")
    seqs = r.axis(r.get(section, "seq_len", where), f"{where}.seq_len")
    grids = {key: r.grid(r.get(section, key, where), (len(dims), len(seqs)), f"{where}.{key}")
             for key in ATTENTION_KEYS}
    return AttentionTable(name, dims, seqs, grids, r.source(section, where))


def _attention(r: _Reader, att: Any) -> tuple[dict[str, AttentionTable], str]:
    """{implementation: table} and the default. A table of one implementation (the form the
    first tables had: the grids directly under `attention`) is read as that one, named by its
    `implementation` (or "sdpa")."""
    if isinstance(att, dict) and "fwd_tflops" in att:
        name = str(att.get("implementation") or "sdpa").strip().lower() or "sdpa"
        return {name: _attention_impl(r, att, name, "attention")}, name
    default = r.get(att, "default", "attention")
    impls = {str(k): _attention_impl(r, v, str(k), f"attention.{k}") for k, v in att.items() if isinstance(v, dict)}
    if not isinstance(default, str) or default not in impls:
        raise r.fail("attention.default", f"is {default!r}, not one of the implementations ({', '.join(impls)})")
    return impls, default


def _overlap(r: _Reader, section: Any) -> dict[str, float] | None:
    if section is None:
        return None
    rates = r.get(section, "compute_rate", "overlap")
    out = {}
    for key in ("one_node", "multi_node"):
        value = r.number(r.get(rates, key, "overlap.compute_rate"), f"overlap.compute_rate.{key}")
        if value > 1:
            raise r.fail(f"overlap.compute_rate.{key}", f"is {value!r}, more than the whole rate")
        out[key] = value
    r.source(section, "overlap")
    return out


def parse_table(data: Any, path: str) -> KernelTable:
    r = _Reader(path)
    if not isinstance(data, dict):
        raise r.fail("the file", f"holds a JSON {type(data).__name__}, not an object")
    gpu = r.get(data, "gpu", "")
    mm = r.get(data, "matmul", "")
    axes = (r.axis(r.get(mm, "m", "matmul"), "matmul.m"), r.axis(r.get(mm, "n", "matmul"), "matmul.n"),
            r.axis(r.get(mm, "k", "matmul"), "matmul.k"))
    grid = r.grid(r.get(mm, "tflops", "matmul"), tuple(len(a) for a in axes), "matmul.tflops")
    impls, default = _attention(r, r.get(data, "attention", ""))
    mem = r.get(data, "memory", "")
    fraction = r.number(r.get(mem, "fraction_of_peak", "memory"), "memory.fraction_of_peak")
    if fraction > 1:
        raise r.fail("memory.fraction_of_peak", f"is {fraction!r}, more than the whole bandwidth")
    overlap = _overlap(r, data.get("overlap"))
    sources = {"matmul": r.source(mm, "matmul"), "attention": impls[default].source,
               "memory": r.source(mem, "memory")}
    if overlap is not None:
        sources["overlap"] = r.source(data["overlap"], "overlap")
    return KernelTable(str(gpu), r.number(r.get(data, "peak_bf16_tflops", ""), "peak_bf16_tflops"),
                       r.number(r.get(data, "memory_gbps", ""), "memory_gbps"), axes, grid, impls, default,
                       fraction, sources, path, overlap)


def load_table(path: str | Path) -> KernelTable:
    data = load_json(path, what="kernel table", expected="a kernel table (microbench/compose/kernels/data/h100.json "
                     "or one written by benchmarks/kernel_tables.py)", finite=True)
    return parse_table(data, str(path))


def shipped(gpu_name: str) -> KernelTable | None:
    """The table shipped for this GPU (a100 serves the A100's 40 and 80 GB parts), or None."""
    key = gpu_name.lower().replace("-", "").replace("_", "")
    for name in (key, key[:4]):
        if (DATA / f"{name}.json").is_file():
            return _shipped_file(name)
    return None


@lru_cache(maxsize=None)
def _shipped_file(name: str) -> KernelTable:
    """The shipped files never change while a process runs: read each once (a calibration's
    bisection prices the step dozens of times)."""
    return load_table(DATA / f"{name}.json")
