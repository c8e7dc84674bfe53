"""The Hugging Face-style model directory modelload reads: `model-0000K-of-0000N.safetensors`
shards and `model.safetensors.index.json` (the weight map `from_pretrained` reads first), written
with the safetensors package. Tensors are 2-D weights of at most TENSOR_BYTES, filled with a
pattern that is exact in every dtype, so every tensor loaded can be checked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

SHARD_BYTES = 5 * 10**9  # what HF's save_pretrained writes (max_shard_size="5GB")
MIN_SHARDS = 5  # a 12B bf16 model's count: smaller totals get smaller shards
TENSOR_BYTES = 64 << 20  # the order of one large transformer weight
COLUMNS = 1024
PERIOD = 251  # 0..250 are exact in float32, bfloat16 and float16
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Tensor:
    name: str
    rows: int
    shard: int

    def nbytes(self, elem: int) -> int:
        return self.rows * COLUMNS * elem


@dataclass(frozen=True)
class Layout:
    dtype: str
    elem: int
    tensors: tuple[Tensor, ...]
    shards: int

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes(self.elem) for t in self.tensors)

    def shard_name(self, k: int) -> str:
        return f"model-{k + 1:05d}-of-{self.shards:05d}.safetensors"

    def in_shard(self, k: int) -> list[Tensor]:
        return [t for t in self.tensors if t.shard == k]


def layout(size_bytes: int, dtype: str, elem: int) -> Layout:
    """Tensors of TENSOR_BYTES (the last one smaller) adding up to `size_bytes` in whole rows,
    dealt in order to shards of SHARD_BYTES, or to MIN_SHARDS shards scaled down with the total."""
    rows_total = max(1, size_bytes // (COLUMNS * elem))
    rows_per = max(1, TENSOR_BYTES // (COLUMNS * elem))
    counts = [rows_per] * (rows_total // rows_per) + ([rows_total % rows_per] if rows_total % rows_per else [])
    shards = min(len(counts), max(MIN_SHARDS, math.ceil(size_bytes / SHARD_BYTES)))
    per = math.ceil(len(counts) / shards)
    shards = math.ceil(len(counts) / per)
    tensors = tuple(Tensor(f"model.layers.{i}.weight", rows, i // per) for i, rows in enumerate(counts))
    return Layout(dtype, elem, tensors, shards)


def pattern(torch: Any, index: int, tensor: Tensor, dtype: Any) -> Any:
    """Element e of tensor `index` holds (e + 7 * index) mod PERIOD: one period tiled."""
    count = tensor.rows * COLUMNS
    offset = (7 * index) % PERIOD
    period = torch.arange(PERIOD, dtype=torch.float32).to(dtype)
    return period.repeat(-(-(count + offset) // PERIOD))[offset : offset + count].clone().view(tensor.rows, COLUMNS)


def write(torch: Any, lay: Layout, root: str) -> list[str]:
    """Every shard (safetensors.torch.save_file), then the index; the shard paths, synced so
    their pages can be dropped."""
    from safetensors.torch import save_file

    dtype = getattr(torch, lay.dtype)
    paths = []
    weight_map = {}
    for k in range(lay.shards):
        state = {}
        for t in lay.in_shard(k):
            state[t.name] = pattern(torch, lay.tensors.index(t), t, dtype)
            weight_map[t.name] = lay.shard_name(k)
        path = os.path.join(root, lay.shard_name(k))
        save_file(state, path, metadata={"format": "pt"})
        paths.append(path)
        del state
    with open(os.path.join(root, INDEX), "x") as handle:
        json.dump({"metadata": {"total_size": lay.total_bytes}, "weight_map": weight_map}, handle, indent=2)
    os.sync()
    return paths


def count_wrong(torch: Any, lay: Layout, loaded: dict[str, Any]) -> int:
    """Wrong elements over every tensor (a missing tensor counts all of its elements)."""
    dtype = getattr(torch, lay.dtype)
    wrong = 0
    for index, t in enumerate(lay.tensors):
        got = loaded.get(t.name)
        if got is None or tuple(got.shape) != (t.rows, COLUMNS) or got.dtype != dtype:
            wrong += t.rows * COLUMNS
            continue
        want = pattern(torch, index, t, dtype)
        got = got.cpu()
        if not torch.equal(got, want):
            wrong += int((got != want).sum().item())
    return wrong


def raw_read(paths: list[str], chunk: int = 16 << 20) -> int:
    """Read every shard front to back into one reused buffer: the storage's sequential rate
    for the same bytes, with nothing parsed."""
    buf = bytearray(chunk)
    view = memoryview(buf)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as handle:
            while True:
                got = handle.readinto(view)
                if not got:
                    break
                total += got
    return total


def safetensors_missing() -> str | None:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError as exc:
        return f"safetensors is not installed ({exc}); pip install safetensors"
    return None
