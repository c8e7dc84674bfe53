"""The compute of one training step of a dense decoder replayed kernel by kernel (what `verify`
predicts from); moved here from the probe's module, which re-exports it."""

from __future__ import annotations

import time
from typing import Any

from ...world.dist import World
from . import Config, _device_resolved, matmul_shapes


class StepReplay:
    """The compute of one training step of a dense decoder, kernel by kernel at its own shapes,
    without the model: per block QKV, causal attention (scaled_dot_product_attention with the
    block's heads and kv heads), the output projection, gate+up and down, in forward; then the
    head and the blocks in reverse with each projection's two backward matmuls and attention's
    backward. Every block has its own operands, as a model's layers do.

    What it leaves out (norms, activations, residual adds, the embedding, the loss, autograd's
    bookkeeping) is what `verify`'s calibrated compute efficiency measures, on a model of its
    own. Timed like a training step: from a barrier to the slowest rank's end, every rank at
    once (ranks share a CPU's cores and memory in training, so a lone rank's rate is not theirs).
    """

    def __init__(self, cfg: Config, heads: int, kv_heads: int):
        cfg = _device_resolved(cfg)
        import torch

        if cfg.experts > 1:
            raise ValueError("the step replay covers dense models")
        self.cfg, self.heads, self.kv_heads = cfg, heads, kv_heads
        assert cfg.dtype is not None and cfg.tokens is not None   # resolved by validate
        dtype = getattr(torch, cfg.dtype)
        gen = torch.Generator().manual_seed(0)

        def rand(*size: int) -> Any:
            return (torch.randn(*size, generator=gen) / size[-1] ** 0.5).to(cfg.device, dtype)

        shapes = [s for s in matmul_shapes(Config(**{**cfg.__dict__, "backward": False})) if s[0] != "head"]
        self.layers = []
        for _ in range(cfg.layers):
            ops = []
            for op, m, n, k, _w in shapes:
                ops.append((op, rand(m, k), rand(k, n), rand(m, n)))   # x, w, dy
            self.layers.append(ops)
        t, h = cfg.tokens, cfg.hidden
        self.head = (rand(t, h), rand(h, cfg.vocab), rand(t, cfg.vocab))
        hd = cfg.q_dim // heads
        self.attn = [(rand(1, heads, t, hd), rand(1, kv_heads, t, hd), rand(1, kv_heads, t, hd), rand(1, heads, t, hd))
                     for _ in range(cfg.layers)]

    def run(self) -> None:
        import torch
        import torch.nn.functional as F

        gqa = self.kv_heads != self.heads
        outs = []
        for ops, (q, k, v, _do) in zip(self.layers, self.attn, strict=False):
            for op, x, w, _dy in ops:
                with torch.no_grad():
                    torch.matmul(x, w)
                if op == "qkv":
                    q, k, v = (a.detach().requires_grad_() for a in (q, k, v))
                    outs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa))
        with torch.no_grad():
            x, w, dy = self.head
            for a, b in ((x, w), (dy, w.t()), (x.t(), dy)):
                torch.matmul(a, b)
        for layer in range(len(self.layers) - 1, -1, -1):
            for op, x, w, dy in reversed(self.layers[layer]):
                with torch.no_grad():
                    torch.matmul(dy, w.t())
                    torch.matmul(x.t(), dy)
                if op == "attn_out":
                    outs[layer].backward(self.attn[layer][3])
        self.sync()

    def sync(self) -> None:
        if self.cfg.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def time_once(self, world: World | None = None) -> float:
        """One replay from a barrier; the slowest rank's seconds (this rank's without a world)."""
        if world is not None:
            world.barrier()
        start = time.perf_counter()
        self.run()
        elapsed = time.perf_counter() - start
        return max(world.all_gather_object(elapsed)) if world is not None else elapsed
