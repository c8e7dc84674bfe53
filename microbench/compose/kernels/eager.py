"""Memory-bound work as eager PyTorch runs it: the aten ops `benchmarks/eager_ops.py` counted for
one transformer block and one root unit, per pass and per activation checkpointing mode's
recompute (data/eager_ops.json), evaluated at a model's shapes.

The file holds, per layout signature (layout / precision / attention call / biases / heads) and
pass, every memory-bound aten op with how many kernels of it run and the bytes they read and write
as integer coefficients on products of the shapes (b micro-batch, s sequence, H heads, kvH kv
heads, D head dim, h hidden, f ffn, V vocabulary, P learned positions); matmuls with their m, n, k
the same way (a test holds them to blocks.py's list). The coefficients are counts, not fits:
the script solves them exactly from runs at many shapes and a test reruns it.

A layout the count does not cover (mixtures of experts, q/k norms, four norms a block, one kv
head, a GPT layout with grouped-query heads, autocast over the Llama layout) returns None and
the hand-listed kernels of blocks.py price it; the breakdown says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...core.errors import UsageError
from ...core.jsonfile import finite_number, load_json
from .blocks import Kernel, is_gpt

DATA = Path(__file__).parent / "data" / "eager_ops.json"
PRECISIONS = ("bf16", "amp_bf16")
ATTENTION_CALLS = ("sdpa", "llmfoundry-triton", "llmfoundry-flash")


@dataclass(frozen=True)
class CountedOp:
    cls: str                              # matmul | attention | memory
    mnk: tuple[int, int, int] = (0, 0, 0)
    kernel: Kernel | None = None          # memory-bound: its bytes at the shape


@dataclass(frozen=True)
class Counted:
    """One unit's counted ops at a shape, per pass (fwd, bwd, recompute_full, recompute_ops and
    their _no_early_stop twins for a block), in run order."""
    signature: str
    passes: dict[str, tuple[CountedOp, ...]]

    def memory(self, pass_: str) -> list[Kernel]:
        return [op.kernel for op in self.passes[pass_] if op.kernel is not None]

    def matmuls(self, pass_: str) -> list[tuple[int, int, int]]:
        return [op.mnk for op in self.passes[pass_] if op.cls == "matmul"]


def _fail(where: str, why: str) -> UsageError:
    return UsageError(f"eager op counts {str(DATA)!r}: {where} {why}; re-run `python benchmarks/eager_ops.py`")


def _coefficients(value: Any, where: str) -> dict[str, int]:
    if not isinstance(value, dict) or not value:
        raise _fail(where, "is missing or empty")
    for mono, c in value.items():
        if isinstance(c, bool) or not finite_number(c) or c != int(c):
            raise _fail(f"{where}.{mono}", f"is {c!r}, not an integer")
    return {str(k): int(v) for k, v in value.items()}


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    data = load_json(DATA, what="eager op counts", expected="the file benchmarks/eager_ops.py writes", finite=True)
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("blocks"), dict)
        or not isinstance(data.get("roots"), dict)
    ):
        raise _fail("the file", "has no blocks and roots")
    return data


def block_signature(model: Any, precision: str, call: str) -> str | None:
    """The counted block this model's block is, or None (priced by the hand list)."""
    if precision not in PRECISIONS or call not in ATTENTION_CALLS:
        return None
    if is_gpt(model):
        if model.kv_heads != model.heads or model.linear_bias != model.norm_bias:
            return None
        return f"gpt/{precision}/{call}/{'bias' if model.linear_bias else 'nobias'}/mha"
    if (model.experts > 1 or model.qk_norm or model.norms_per_block != 2 or model.mlp_bias
            or model.attention_sinks or precision != "bf16" or call != "sdpa" or model.kv_heads < 2):
        return None
    bias = "qkvbias" if model.qkv_bias else "nobias"
    return f"llama/bf16/sdpa/{bias}/{'gqa' if model.kv_heads < model.heads else 'mha'}"


def root_signature(model: Any, precision: str, loss: str) -> str | None:
    if precision not in PRECISIONS or model.towers:
        return None
    if is_gpt(model):
        if model.linear_bias != model.norm_bias or not model.tied_embeddings:
            return None
        return (f"gpt/{precision}/{'bias' if model.norm_bias else 'nobias'}/"
                f"{'positions' if model.positions else 'nopositions'}/{loss}")
    if model.tied_embeddings or precision != "bf16":
        return None
    return f"llama/bf16/untied/{loss}"


def dims(model: Any, micro_batch: int, seq_len: int) -> dict[str, int]:
    return {"b": micro_batch, "s": seq_len, "H": model.heads, "kvH": model.kv_heads, "D": model.head_dim,
            "h": model.hidden, "f": model.ffn, "V": model.vocab, "P": getattr(model, "positions", 0) or seq_len}


def _value(coefficients: dict[str, int], at: dict[str, int]) -> float:
    total = 0.0
    for mono, c in coefficients.items():
        v = float(c)
        for p in mono.split("*"):
            if p != "1":
                v *= at[p]
        total += v
    return total


def _entry(kind: str, signature: str) -> dict[str, Any]:
    table = _data()["blocks" if kind == "block" else "roots"]
    entry = table.get(signature)
    if isinstance(entry, dict) and "same_as" in entry:
        entry = table.get(entry["same_as"])
    if not isinstance(entry, dict):
        raise _fail(f"{kind}s.{signature}", "is missing")
    return entry


@lru_cache(maxsize=256)
def _counted(kind: str, signature: str, at: tuple[tuple[str, int], ...]) -> Counted:
    values = dict(at)
    passes: dict[str, tuple[CountedOp, ...]] = {}
    for pass_, ops in _entry(kind, signature).items():
        where = f"{kind}s.{signature}.{pass_}"
        if not isinstance(ops, list):
            raise _fail(where, "is not a list of ops")
        out = []
        for i, op in enumerate(ops):
            cls = op.get("class") if isinstance(op, dict) else None
            if cls == "matmul":
                m, n, k = (int(_value(_coefficients(op.get(a), f"{where}[{i}].{a}"), values)) for a in "mnk")
                out.append(CountedOp("matmul", (m, n, k)))
            elif cls == "memory":
                nbytes = _value(_coefficients(op.get("bytes"), f"{where}[{i}].bytes"), values)
                name = str(op.get("op", "")).split(".", 1)[-1]
                kernel = Kernel(name, "memory", bytes=nbytes, op="eager",
                                pass_="fwd" if pass_ == "fwd" else "bwd" if pass_ == "bwd" else "recompute")
                out.append(CountedOp("memory", kernel=kernel))
            elif cls == "attention":
                out.append(CountedOp("attention"))
            else:
                raise _fail(f"{where}[{i}].class", f"is {cls!r}")
        passes[pass_] = tuple(out)
    return Counted(signature, passes)


def counted_block(model: Any, micro_batch: int, seq_len: int, precision: str, call: str) -> Counted | None:
    sig = block_signature(model, precision, call)
    if sig is None:
        return None
    return _counted("block", sig, tuple(sorted(dims(model, micro_batch, seq_len).items())))


def counted_root(model: Any, micro_batch: int, seq_len: int, precision: str, loss: str) -> Counted | None:
    sig = root_signature(model, precision, loss)
    if sig is None:
        return None
    return _counted("root", sig, tuple(sorted(dims(model, micro_batch, seq_len).items())))


def attention_call(impl: str | None, model: Any) -> str:
    """The attention call a trainer wraps around this kernel by default: torch's SDPA, except the
    Triton FlashAttention kernel, which only llm-foundry's MPT runs (triton_flash_attn_fn)."""
    return "llmfoundry-triton" if impl == "triton" and is_gpt(model) else "sdpa"
