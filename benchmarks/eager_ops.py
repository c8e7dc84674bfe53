"""Count what eager PyTorch runs for one transformer block and one root unit, forward, backward and
each activation checkpointing mode's recompute, and write the per-op coefficients the composer
prices memory-bound work with (microbench/compose/kernels/data/eager_ops.json).

    python benchmarks/eager_ops.py            # regenerate the shipped file
    python benchmarks/eager_ops.py --check    # regenerate in memory; exit 1 if the shipped file differs
    python benchmarks/eager_ops.py --direct block gpt/amp_bf16/llmfoundry-triton/bias/mha \
        --dims b=2,s=16,H=12,D=128,f=6144,kvH=12,V=50368,P=2048      # one count at one shape, as JSON

How: the modules of eager_blocks.py (as llm-foundry and torchtitan write them) run forward and
backward on this CPU under a TorchDispatchMode that records every aten op with its class (matmul:
mm, addmm, bmm, baddbmm, with m, n, k; attention: the FlashAttention stand-in; memory-bound:
everything else) and the bytes it reads and writes: each input tensor's distinct elements (a
broadcast input once; the rows an embedding or gather reads, not its table) and each output,
times the element size. Views, aliases and allocations (empty) move nothing and are not kernels.
CUDA's layer_norm keeps mean and rstd in fp32 for bf16 input where the CPU build keeps bf16: those
two tensors are counted at 4 bytes. Under checkpointing (torch.utils.checkpoint, non-reentrant, as
Composer's and torchtitan's wrappers run it) the ops that run inside the block's forward during
backward are its recompute; `ops` is torchtitan's op-level policy (the outputs of aten.mm and
attention saved, except every second mm). Recompute is counted twice: as torch >= 2.1 runs it,
stopping once every tensor backward needs is back (the last matmul of an MLP is not run again), and
as torch <= 2.0 ran it, the whole forward again (`_no_early_stop`).

Every op's bytes are a sum of products of the shapes (tokens x width, a weight's size, ...): the
block runs at many small random shapes and each op's bytes, m, n and k are solved exactly as
integer coefficients on those products (exact on every shape run, else the script fails), so the
coefficients are counted, not fitted: a test reruns this and compares with the shipped file, and
evaluates one at a real hidden size against a direct count. Precision: `bf16` is parameters cast
to bf16 for compute with no autocast (FSDP2's MixedPrecisionPolicy, FSDP1 PURE); `amp_bf16` the
same parameters under torch.autocast (Composer's amp_bf16 with FSDP mixed precision DEFAULT or
PURE: FSDP casts the parameters, so the residual stream is bf16). The CPU's autocast op lists
differ from CUDA's; a count under autocast is refused when an op whose policy differs ran in it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: F401  (eager_blocks' functions run under the recorder)
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts,
                                   set_checkpoint_early_stop)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import eager_blocks as eb  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "microbench" / "compose" / "kernels" / "data" / "eager_ops.json"
MATMUL = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
ATTENTION = {"mbcount.attention.default", "mbcount.attention_backward.default"}
FACTORIES = {"aten.empty.memory_format", "aten.empty_like.default", "aten.empty_strided.default",
             "aten.new_empty.default", "aten.new_empty_strided.default"}
WRITE_ONLY_FIRST = {"aten.copy_.default", "aten.fill_.Scalar", "aten.zero_.default", "aten.scatter_.src",
                    "aten.index_put_.default", "aten._index_put_impl_.default"}
# the first argument is read only where the index points: as many elements as the output
GATHERS = {"aten.embedding.default": 0, "aten.gather.default": 0, "aten.index_select.default": 0,
           "aten.index.Tensor": 0}
NOT_READ = {"aten.nll_loss_backward.default": (1,), "aten.nll_loss_forward.default": (0,)}
# CUDA keeps these in fp32 for bf16 inputs (acc_type): (outputs, inputs) positions
CUDA_FP32 = {"aten.native_layer_norm.default": ((1, 2), ()), "aten.native_layer_norm_backward.default": ((), (2, 3))}
# torch functions whose autocast policy differs between CUDA and the CPU (torch.amp docs' op lists)
AUTOCAST_DIFFERS = {"layer_norm", "group_norm", "softmax", "log_softmax", "softmin", "softplus", "exp", "expm1",
                    "log", "log1p", "log2", "log10", "pow", "rsqrt", "reciprocal", "sum", "cumsum", "cumprod",
                    "norm", "normalize", "rms_norm", "view_as_complex", "polar", "cross_entropy", "nll_loss",
                    "acos", "asin", "cosh", "sinh", "tan", "erfinv", "dist", "prod", "renorm"}
# (checkpointing, early stop): torch >= 2.1 stops a recompute once every tensor backward needs is
# back (pytorch/pytorch#96866), torch <= 2.0 re-ran the whole forward
MODES = (("none", True), ("full", True), ("ops", True), ("full", False), ("ops", False))


def distinct_bytes(t: torch.Tensor) -> int:
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


class Recorder(TorchDispatchMode):
    """Every aten op: (phase, name, class, bytes, (m, n, k))."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.phase = "fwd"
        self.in_block = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if func.is_view or name in FACTORIES or name.startswith("aten.detach") or name == "aten.lift_fresh.default":
            return out
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        mutable = func._schema.is_mutable
        storages = {t.untyped_storage().data_ptr() for t in ins}
        if not mutable and outs and all(t.untyped_storage().data_ptr() in storages for t in outs):
            return out   # an alias (_unsafe_view and the like)
        phase = "recompute" if self.phase == "bwd" and self.in_block else self.phase
        cls = "matmul" if name in MATMUL else "attention" if name in ATTENTION else "memory"
        mnk = ()
        if cls == "matmul":
            a, b = (args[1], args[2]) if "add" in name else (args[0], args[1])
            mnk = (a.shape[-2], b.shape[-1], a.shape[-1])
            if a.dim() == 3:
                mnk = (a.shape[0] * a.shape[1], b.shape[-1], a.shape[-1])
        fp32_out, fp32_in = CUDA_FP32.get(name, ((), ()))
        read = 0
        for i, arg in enumerate(list(args) + list(kwargs.values())):
            if i in NOT_READ.get(name, ()) or (i == 0 and name in WRITE_ONLY_FIRST):
                continue
            for a in (t for t in pytree.tree_leaves(arg) if isinstance(t, torch.Tensor)):
                nbytes = distinct_bytes(a)
                if GATHERS.get(name) == i:
                    nbytes = outs[0].numel() * a.element_size()
                if i in fp32_in and a.is_floating_point():
                    nbytes = nbytes // a.element_size() * 4
                read += nbytes
        if name == "aten.nll_loss_forward.default":
            read += args[1].numel() * args[0].element_size()   # the target's logits only
        written = sum(t.numel() * (4 if i in fp32_out else t.element_size()) for i, t in enumerate(outs))
        self.ops.append((phase, name, cls, read + written, mnk))
        return out


class AutocastWatch(TorchFunctionMode):
    """Refuses a count under autocast when a function whose autocast policy differs between CUDA
    and the CPU ran with autocast on and a reduced-precision input."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if torch.is_autocast_enabled("cpu") and name.lstrip("_") in AUTOCAST_DIFFERS:
            low = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16]
            if low:
                raise RuntimeError(f"{name} ran under autocast: CUDA's and the CPU's autocast treat it differently, "
                                   "so this count would not be CUDA's")
        return func(*args, **kwargs)


# ----------------------------------------------------------------------------- signatures

def block_signatures():
    for precision, call, bias in itertools.product(("bf16", "amp_bf16"), ("sdpa", "llmfoundry-triton",
                                                   "llmfoundry-flash"), (True, False)):
        yield f"gpt/{precision}/{call}/{'bias' if bias else 'nobias'}/mha"
    for qkv_bias, gqa in itertools.product((False, True), (False, True)):
        yield f"llama/bf16/sdpa/{'qkvbias' if qkv_bias else 'nobias'}/{'gqa' if gqa else 'mha'}"


def root_signatures():
    for precision, bias, positions, loss in itertools.product(("bf16", "amp_bf16"), (True, False), (True, False),
                                                              ("fused", "eager")):
        yield f"gpt/{precision}/{'bias' if bias else 'nobias'}/{'positions' if positions else 'nopositions'}/{loss}"
    for loss in ("fused", "eager"):
        yield f"llama/bf16/untied/{loss}"


def random_dims(layout: str, gqa: bool, rng: random.Random) -> dict[str, int]:
    kvh = rng.randint(2, 4)   # one kv head (multi-query) takes other paths: not counted
    heads = kvh * (rng.randint(2, 3) if gqa else 1)
    d = {"b": rng.randint(2, 4), "s": rng.randint(3, 9), "H": heads, "kvH": kvh, "D": 2 * rng.randint(1, 5),
         "f": rng.randint(3, 24), "V": rng.randint(5, 40)}
    d["h"] = d["H"] * d["D"] if layout == "gpt" else rng.randint(4, 24)
    d["P"] = d["s"] + rng.randint(0, 5)
    return d


def token_widths(layout: str, gqa: bool, root: bool) -> tuple[list[str], list[str]]:
    tokens = ["1", "b", "s", "b*s"]
    if root:
        return tokens, ["1", "h", "V"] + (["P", "h*P", "h*V"] if layout == "gpt" else ["h*V"])
    widths = ["1", "H", "D", "H*D", "f"] + (["kvH", "D*kvH"] if gqa else [])
    if layout == "llama":
        widths += ["h"]
    return tokens, widths


def basis(layout: str, gqa: bool, root: bool) -> list[str]:
    tokens, widths = token_widths(layout, gqa, root)
    out = sorted({_mono(f"{t}*{w}") for t in tokens for w in widths})
    if not root:
        h = "D*H" if layout == "gpt" else "h"
        out += sorted({_mono(f"{h}*{w}") for w in ("D*H", "f", "D*kvH" if gqa else "D*H")} - set(out))
    return out


def _mono(text: str) -> str:
    parts = sorted(p for p in text.split("*") if p != "1")
    return "*".join(parts) or "1"


def _value(mono: str, dims: dict[str, int]) -> int:
    v = 1
    for p in mono.split("*"):
        if p != "1":
            v *= dims[p]
    return v


# ----------------------------------------------------------------------------- running the modules

@contextmanager
def _maybe_autocast(precision: str):
    if precision == "amp_bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16), AutocastWatch():
            yield
    else:
        yield


def _policy(meta):
    def policy(ctx, func, *args, **kwargs):
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in (torch.ops.aten.mm.default, torch.ops.mbcount.attention.default) and not (
            func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def count_block(sig: str, dims: dict[str, int], mode: str, early_stop: bool = True) -> list[tuple]:
    layout, precision, call, bias, _ = sig.split("/")
    b, s, h = dims["b"], dims["s"], dims["h"]
    if layout == "gpt":
        block = eb.GptBlock(h, dims["H"], dims["kvH"], dims["f"], bias == "bias", call)
        extra = None
    else:
        block = eb.LlamaBlock(h, dims["H"], dims["kvH"], dims["D"], dims["f"], call)
        if bias == "qkvbias":
            for lin in (block.wq, block.wk, block.wv):
                lin.bias = torch.nn.Parameter(torch.zeros(lin.out_features))
        extra = torch.polar(torch.ones(s, dims["D"] // 2), torch.rand(s, dims["D"] // 2))
    block = block.to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(b, s, h, dtype=torch.bfloat16)
    rec = Recorder()

    def run(inp):
        rec.in_block += 1
        try:
            return block(inp, extra)
        finally:
            rec.in_block -= 1

    with rec, set_checkpoint_early_stop(early_stop):
        with _maybe_autocast(precision):
            if mode == "none":
                y = run(x)
            elif mode == "full":
                y = checkpoint(run, x, use_reentrant=False)
            else:
                meta = {"forward_mm": 0, "recompute_mm": 0}
                y = checkpoint(run, x, use_reentrant=False,
                               context_fn=lambda: create_selective_checkpoint_contexts(_policy(meta)))
        rec.phase = "bwd"
        y.backward(grad)
    return rec.ops


def count_root(sig: str, dims: dict[str, int]) -> list[tuple]:
    parts = sig.split("/")
    layout, precision, loss = parts[0], parts[1], parts[-1]
    b, s, h, v = dims["b"], dims["s"], dims["h"], dims["V"]
    if layout == "gpt":
        root = eb.GptRoot(h, v, dims["P"] if "positions" in parts else 0, "bias" in parts, loss)
    else:
        root = eb.LlamaRoot(h, v, loss)
    root = root.to(torch.bfloat16)
    ids, labels = torch.randint(0, v, (b, s)), torch.randint(0, v, (b, s))
    rec = Recorder()
    with rec:
        with _maybe_autocast(precision):
            out = root(ids, labels)
        rec.phase = "bwd"
        out.backward()
    return rec.ops


# ----------------------------------------------------------------------------- exact coefficients

def solve(columns: list[str], runs: list[tuple[dict, list[float]]], what: str) -> list[dict[str, int]]:
    """Integer coefficients c (one dict per quantity) with quantity = sum c[m] * m(dims) on every run."""
    import numpy as np

    a = np.array([[_value(c, d) for c in columns] for d, _ in runs], dtype=float)
    y = np.array([vals for _, vals in runs], dtype=float)
    x, *_ = np.linalg.lstsq(a, y, rcond=None)
    coeffs = np.rint(x).astype(int)
    if not np.array_equal(a.astype(np.int64) @ coeffs, y.astype(np.int64)):
        raise RuntimeError(f"{what}: the counted bytes are not an exact sum of {columns}")
    return [{c: int(coeffs[i, j]) for i, c in enumerate(columns) if coeffs[i, j]} for j in range(y.shape[1])]


def derive(kind: str, sig: str, mode: str, shapes: int, seed: int, early_stop: bool = True) -> dict:
    layout, gqa = sig.split("/")[0], sig.endswith("/gqa")
    root = kind == "root"
    columns = basis(layout, gqa, root)
    rng = random.Random(seed)
    runs, names = [], None
    for _ in range(shapes):
        dims = random_dims(layout, gqa, rng)
        ops = count_root(sig, dims) if root else count_block(sig, dims, mode, early_stop)
        these = [(p, n, c) for p, n, c, _, _ in ops]
        if names is None:
            names = these
        elif these != names:
            raise RuntimeError(f"{sig} {mode}: the op sequence changed with the shape {dims}")
        values = []
        for _, _, cls, nbytes, mnk in ops:
            values += list(mnk) if cls == "matmul" else [] if cls == "attention" else [nbytes]
        runs.append((dims, values))
    flat = solve(columns, runs, f"{kind} {sig} {mode}")
    out: dict[str, list] = {}
    it = iter(flat)
    for phase, name, cls in names:
        entry = {"op": name.replace(".default", ""), "class": cls}
        if cls == "matmul":
            entry.update(m=next(it), n=next(it), k=next(it))
        elif cls == "memory":
            entry["bytes"] = next(it)
        out.setdefault(phase, []).append(entry)
    return out


def merge(entries: list[dict]) -> list[dict]:
    """Memory-bound ops of one pass summed per aten op (with how many kernels); matmuls and
    attention kept one by one, in run order."""
    out, by_op = [], {}
    for e in entries:
        if e["class"] != "memory":
            out.append(e)
            continue
        if e["op"] not in by_op:
            by_op[e["op"]] = {"op": e["op"], "class": "memory", "kernels": 0, "bytes": {}}
            out.append(by_op[e["op"]])
        m = by_op[e["op"]]
        m["kernels"] += 1
        for k, v in e["bytes"].items():
            m["bytes"][k] = m["bytes"].get(k, 0) + v
        m["bytes"] = {k: v for k, v in m["bytes"].items() if v}
    return out


def generate(shapes: int = 0, seed: int = 17) -> dict:
    data = {"description": "the aten ops eager PyTorch runs per block and root unit, per pass and checkpointing "
                           "mode: memory-bound bytes and matmul m, n, k as integer coefficients on products of "
                           "the shapes (microbench/compose/kernels/eager.py reads it)",
            "generator": "benchmarks/eager_ops.py",
            "torch": torch.__version__.split("+")[0], "variables": {
                "b": "micro-batch", "s": "sequence length", "H": "heads", "kvH": "kv heads", "D": "head dim",
                "h": "hidden", "f": "ffn (per expert)", "V": "vocabulary", "P": "learned positions"},
            "blocks": {}, "roots": {}}
    for sig in block_signatures():
        layout, gqa = sig.split("/")[0], sig.endswith("/gqa")
        n = shapes or len(basis(layout, gqa, False)) + 8
        entry: dict[str, list] = {}
        for mode, early_stop in MODES:
            passes = derive("block", sig, mode, n, seed, early_stop)
            if mode == "none":
                entry.update(fwd=merge(passes["fwd"]), bwd=merge(passes["bwd"]))
                continue
            if merge(passes["fwd"]) != entry["fwd"] or merge(passes["bwd"]) != entry["bwd"]:
                raise RuntimeError(f"{sig}: checkpointing {mode} changed the forward or backward ops")
            entry[f"recompute_{mode}" + ("" if early_stop else "_no_early_stop")] = merge(passes.get("recompute", []))
        data["blocks"][sig] = entry
    for sig in root_signatures():
        layout = sig.split("/")[0]
        passes = derive("root", sig, "none", shapes or len(basis(layout, False, True)) + 8, seed)
        data["roots"][sig] = {"fwd": merge(passes["fwd"]), "bwd": merge(passes["bwd"])}
    for kind in ("blocks", "roots"):
        for sig, entry in data[kind].items():
            # autocast over bf16 parameters runs the same ops in these layouts: said once
            twin = sig.replace("/amp_bf16/", "/bf16/")
            if twin != sig and data[kind].get(twin) == entry:
                data[kind][sig] = {"same_as": twin}
    return data


def direct(kind: str, sig: str, dims: dict[str, int]) -> dict:
    """One count at one shape: per pass, memory-bound bytes summed per op, and the matmuls' (m, n, k)."""
    dims = {"kvH": dims.get("H", 1), "P": dims.get("s", 1), **dims}
    if sig.startswith("gpt/") and "h" not in dims:
        dims["h"] = dims["H"] * dims["D"]
    out: dict = {}
    runs = [("", count_root(sig, dims))] if kind == "root" else [
        (f"{mode}{'' if stop else '_no_early_stop'}", count_block(sig, dims, mode, stop)) for mode, stop in MODES]
    for mode, ops in runs:
        for phase, name, cls, nbytes, mnk in ops:
            if phase != "recompute" and mode not in ("", "none"):
                continue   # the same forward and backward again
            entry = out.setdefault(f"recompute_{mode}" if phase == "recompute" else phase, {"memory": {}, "matmul": []})
            if cls == "memory":
                op = name.replace(".default", "")
                entry["memory"][op] = entry["memory"].get(op, 0) + nbytes
            elif cls == "matmul":
                entry["matmul"].append(list(mnk))
    return out


def dump(data: dict) -> str:
    """The JSON with one op a line: diffs of a regenerated file read op by op."""
    lines = ["{"]
    head = [k for k in data if k not in ("blocks", "roots")]
    for k in head:
        lines.append(f" {json.dumps(k)}: {json.dumps(data[k])},")
    for n, kind in enumerate(("blocks", "roots")):
        lines.append(f" {json.dumps(kind)}: {{")
        sigs = list(data[kind].items())
        for i, (sig, entry) in enumerate(sigs):
            tail = "," if i < len(sigs) - 1 else ""
            if "same_as" in entry:
                lines.append(f"  {json.dumps(sig)}: {json.dumps(entry)}{tail}")
                continue
            lines.append(f"  {json.dumps(sig)}: {{")
            passes = list(entry.items())
            for j, (pass_, ops) in enumerate(passes):
                body = ",\n".join(f"    {json.dumps(op)}" for op in ops)
                lines.append(f"   {json.dumps(pass_)}: [\n{body}\n   ]" + ("," if j < len(passes) - 1 else ""))
            lines.append("  }" + tail)
        lines.append(" }" + ("," if n == 0 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare a fresh count with the shipped file; exit 1 if different")
    p.add_argument("--out", default=str(OUT), help="where to write (default: the shipped data file)")
    p.add_argument("--direct", nargs=2, metavar=("KIND", "SIGNATURE"),
                   help="count one block or root at --dims and print its ops per pass as JSON (no solving)")
    p.add_argument("--dims", default="", help="b=..,s=..,H=..,kvH=..,D=..,f=..,V=..,P=.. (h = H x D for gpt)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.direct:
        print(json.dumps(direct(*args.direct, dict((k, int(v)) for k, v in
                                                   (x.split("=") for x in args.dims.split(",") if x)))))
        return 0
    data = generate()
    text = dump(data)
    json.loads(text)
    if args.check:
        shipped = Path(args.out).read_text() if Path(args.out).exists() else ""
        if shipped != text:
            print(f"{args.out} differs from a fresh count: re-run python benchmarks/eager_ops.py", file=sys.stderr)
            return 1
        print(f"{args.out}: the same as a fresh count")
        return 0
    Path(args.out).write_text(text)
    print(f"wrote {args.out}: {len(data['blocks'])} block and {len(data['roots'])} root signatures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
