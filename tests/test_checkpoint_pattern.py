"""The checkpoint probe's pattern (tiled, not computed per element) and its wrong-element count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from microbench.probes.checkpoint import PATTERN_PERIOD, ROW_ELEMS, CheckpointProbe  # noqa: E402


def _fake(rank: int, dtype, rows: list[int]) -> SimpleNamespace:
    fake = SimpleNamespace(torch=torch, rank=rank, dtype=dtype, device=torch.device("cpu"), rows=rows)
    fake._pattern = lambda i, r: CheckpointProbe._pattern(fake, i, r)
    return fake


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rank,index,rows", [(0, 0, 3), (1, 2, 5), (3, 7, 1)])
def test_pattern_is_the_formula(dtype, rank, index, rows):
    got = CheckpointProbe._pattern(_fake(rank, dtype, [rows]), index, rows)
    first = rank * rows * ROW_ELEMS
    want = ((torch.arange(first, first + rows * ROW_ELEMS) + 7 * index) % PATTERN_PERIOD).to(dtype)
    assert torch.equal(got.flatten(), want) and got.shape == (rows, ROW_ELEMS)
    assert got.untyped_storage().nbytes() == got.numel() * got.element_size()


class _Local:
    def __init__(self, t):
        self.t = t

    def to_local(self):
        return self.t


def test_count_wrong_counts_each_bad_element_and_the_step():
    fake = _fake(1, torch.float32, [2, 3])
    fake.state = {"step": 1000, **{f"layers.{i}.weight": _Local(fake._pattern(i, r)) for i, r in enumerate(fake.rows)}}
    loaded = {"step": 1000, **{k: _Local(v.t.clone()) for k, v in fake.state.items() if k != "step"}}
    assert CheckpointProbe._count_wrong(fake, loaded) == 0
    loaded["layers.1.weight"].t[0, 5] += 1
    loaded["layers.0.weight"].t[1, :3] = -1
    loaded["step"] = 0
    assert CheckpointProbe._count_wrong(fake, loaded) == 1 + 1 + 3
