"""Activation checkpointing as trainers do it: what each mode runs again in backward, and what
it keeps in memory.

  none      nothing recomputed; every activation backward needs is kept.
  full      every block's forward runs again before its backward (checkpoint_wrapper on each
            block); each block keeps only its input.
  blocks:F  a fraction F of the blocks is checkpointed as `full`, the rest not: torchtitan's
            selective layer checkpointing every second block is blocks:0.5.
  ops       op-level selective checkpointing as torchtitan's policy does it (its
            `_custom_policy`: the outputs of aten.mm and of SDPA are saved, except every second
            aten.mm of a block, counted in forward order; everything else is recomputed). A
            linear with a bias runs as aten.addmm, which the policy neither saves nor counts, and
            experts run as grouped matmuls: both are recomputed. Attention is never recomputed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ...core.errors import UsageError
from .blocks import ACT_BYTES, Kernel, is_gpt

MODES = ("none", "full", "blocks:F", "ops")


@dataclass(frozen=True)
class Checkpointing:
    mode: str  # none | full | blocks | ops
    fraction: float  # share of blocks checkpointed (ops: every block, at op level)

    @property
    def label(self) -> str:
        return f"blocks:{self.fraction:g}" if self.mode == "blocks" else self.mode

    @property
    def recomputes(self) -> bool:
        return self.mode != "none" and self.fraction > 0


def parse_checkpointing(value: Any) -> Checkpointing:
    """none | full | blocks:F (0 < F <= 1) | ops; True (the bare flag) is full, False none."""
    if value is True:
        return Checkpointing("full", 1.0)
    if value is False or value is None:
        return Checkpointing("none", 0.0)
    text = str(value).strip().lower()
    if text in ("none", "off", "no"):
        return Checkpointing("none", 0.0)
    if text in ("full", "on", "true"):
        return Checkpointing("full", 1.0)
    if text in ("ops", "op", "selective-op"):
        return Checkpointing("ops", 1.0)
    if text.startswith("blocks:"):
        raw = text.partition(":")[2]
        try:
            fraction = float(raw)
        except ValueError:
            fraction = math.nan
        if not (math.isfinite(fraction) and 0 < fraction <= 1):
            raise UsageError(
                f"invalid --activation-checkpointing {value!r}: blocks:F takes the fraction of blocks "
                f"checkpointed, above 0 and at most 1, e.g. blocks:0.5 (every second block)"
            )
        return Checkpointing("full", 1.0) if fraction == 1 else Checkpointing("blocks", fraction)
    raise UsageError(
        f"invalid --activation-checkpointing {value!r}: expected one of {', '.join(MODES)} "
        f"(the bare flag means full), e.g. --activation-checkpointing ops"
    )


def recomputed(forward: list[Kernel], mode: Checkpointing) -> list[Kernel]:
    """The kernels one block runs again in backward, each weighted by the share of blocks that do."""
    if not mode.recomputes:
        return []
    if mode.mode in ("full", "blocks"):
        return [replace(k, pass_="recompute", count=k.count * mode.fraction) for k in forward]
    out, mm_count = [], 0
    for k in forward:
        if k.op == "mm":
            mm_count += 1
            if mm_count % 2 == 0:
                out.append(replace(k, pass_="recompute"))
        elif k.op != "sdpa":
            out.append(replace(k, pass_="recompute"))
    return out


def _saved_elements_ops(forward: list[Kernel]) -> float:
    """Elements per block kept under the ops policy: the saved matmuls' outputs and attention's."""
    kept, mm_count = 0.0, 0
    for k in forward:
        if k.op == "mm":
            mm_count += 1
            if mm_count % 2 == 1:
                kept += k.m * k.n * k.count
        elif k.op == "sdpa":
            kept += k.bytes / ACT_BYTES / 4  # its output: one of the four q/k/v/o-sized tensors it moves
    return kept


def activation_bytes(
    model: Any, micro_batch: int, seq_len: int, mode: Checkpointing, forward: list[Kernel] | None = None
) -> float | None:
    """bf16 tensors backward needs for one micro-batch, the logits included (bf16 and the fp32
    copy the loss makes). Without checkpointing, per token and block: the norms' inputs and
    outputs, q, k, v and attention's output (flash attention keeps no s x s matrix) and the
    MLP's intermediates (gate, up, product per routed expert; up and GELU output for a GPT
    MLP). Checkpointed blocks keep their input, plus one block's full set while it is
    recomputed; under `ops` each block keeps its input and what the policy saves."""
    if not hasattr(model, "hidden"):
        return None
    h, tokens = model.hidden, micro_batch * seq_len
    q, kv = model.heads * model.head_dim, model.kv_heads * model.head_dim
    if is_gpt(model):
        per_token_block = ACT_BYTES * (4 * h + 2 * q + 2 * kv + 2 * model.ffn)
    else:
        per_token_block = ACT_BYTES * (4 * h + 2 * q + 2 * kv + 3 * model.ffn * model.top_k)
    full_block = tokens * per_token_block
    inputs = tokens * ACT_BYTES * h
    logits = tokens * model.vocab * (2 + 4)
    L = model.layers
    if mode.mode == "none" or not mode.recomputes:
        return L * full_block + logits
    if mode.mode == "ops":
        from .blocks import block_forward

        kept = _saved_elements_ops(forward or block_forward(model, micro_batch, seq_len)) * ACT_BYTES
        return L * (inputs + kept) + full_block + logits
    f = mode.fraction
    return L * (f * inputs + (1 - f) * full_block) + full_block + logits
