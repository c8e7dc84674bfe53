"""Rates from a `microbench compute` record, kernel by kernel: the row measured at exactly a
kernel's shape first; else the record's rate for that class at the shapes it did measure (used,
and said so, with the command that measures the right ones); else the fallback (the GPU's
table). A record timed at other shapes is still the user's GPU: better than a table, worse than
the right shapes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .blocks import Kernel
from .pricing import Rates

# The memory-bound kernels the probe times; the others (FSDP's copies, bias gradients, zeroing the
# embedding's gradient) take the record's memory-bound rate without a word: no probe case has them.
PROBED_MEMORY = {"norm", "qk_norm", "rotary", "residual", "swiglu", "gelu", "embedding", "positions", "loss"}


def _key(kernel: Kernel) -> tuple:
    if kernel.cls == "matmul":
        return ("matmul", kernel.m, kernel.n, kernel.k)
    if kernel.cls == "attention":
        return ("attention", "bwd" if kernel.pass_ == "bwd" else "fwd", kernel.seq_len, kernel.head_dim, kernel.causal)
    return ("memory", kernel.name.split(".")[0])


def _row_key(row: dict[str, Any]) -> tuple | None:
    cls = row.get("cls", "matmul")
    if cls == "matmul" and all(isinstance(row.get(a), int) for a in "mnk"):
        return ("matmul", row["m"], row["n"], row["k"])
    if cls == "attention":
        return (
            "attention",
            "bwd" if str(row.get("op", "")).endswith("bwd") else "fwd",
            row.get("seq_len"),
            row.get("head_dim"),
            bool(row.get("causal", True)),
        )
    if cls == "memory":
        return ("memory", str(row.get("op")))
    return None


def _class_rate(rows: list[dict[str, Any]], cls: str) -> float | None:
    """Work over time across a class's rows, weighted by how often a step runs each."""
    work = time = 0.0
    for r in rows:
        if r.get("cls", "matmul") != cls:
            continue
        amount = float(r.get("bytes" if cls == "memory" else "flops") or 0) * float(r.get("per_block") or 1)
        rate = float(r.get("gbps" if cls == "memory" else "tflops") or 0) * (1e9 if cls == "memory" else 1e12)
        if amount > 0 and rate > 0:
            work += amount
            time += amount / rate
    return work / time if time > 0 else None


@dataclass
class RecordRates:
    rows: list[dict[str, Any]]
    path: str
    fallback: Rates
    misses: dict[str, set[str]] = field(default_factory=dict)  # class -> kernels priced at another shape

    def __post_init__(self) -> None:
        self._exact: dict[tuple, float] = {}
        for r in self.rows:
            key = _row_key(r)
            rate = r.get("gbps") if r.get("cls") == "memory" else r.get("tflops")
            if key is not None and isinstance(rate, (int, float)) and rate > 0:
                self._exact[key] = rate * (1e9 if key[0] == "memory" else 1e12)
        self._per_class = {c: _class_rate(self.rows, c) for c in ("matmul", "attention", "memory")}

    def rate(self, kernel: Kernel) -> tuple[float, str]:
        exact = self._exact.get(_key(kernel))
        if exact is not None:
            return exact, f"measured: {self.path}"
        fallback_class = self._per_class.get(kernel.cls)
        probed = kernel.cls != "memory" or kernel.name.split(".")[0] in PROBED_MEMORY
        if probed:
            self.misses.setdefault(kernel.cls, set()).add(kernel.name)
        if fallback_class:
            return fallback_class, f"measured: {self.path} ({'other shapes' if probed else 'memory-bound rate'})"
        return self.fallback.rate(kernel)


def shapes_line(rates: RecordRates, model: str, micro_batch: int, seq_len: int, checkpointing: str) -> str | None:
    """One line naming what the record did not measure at this step's shapes, and the command that does."""
    if not rates.misses:
        return None
    what = ", ".join(f"{cls} ({len(names)} kernels)" for cls, names in sorted(rates.misses.items()))
    return (
        f"--compute {rates.path} was not measured at this step's shapes for {what}: its rates at other shapes "
        f"are used; `microbench compute --model {model} --micro-batch {micro_batch} --seq-len {seq_len} "
        f"--activation-checkpointing {checkpointing}` on the GPU measures these"
    )
