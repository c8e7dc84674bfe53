"""The checkpoint probe's pattern (tiled, not computed per element) and its wrong-element count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from microbench.probes.checkpoint import ROW_ELEMS, CheckpointProbe  # noqa: E402
from microbench.probes.checkpoint.synthetic_state import PATTERN_PERIOD  # noqa: E402
from microbench.probes.checkpoint.state_layout import Item  # noqa: E402


def _fake(rank: int, entries: list) -> SimpleNamespace:
    fake = SimpleNamespace(torch=torch, rank=rank, device=torch.device("cpu"), entries=entries)
    fake._pattern = lambda *a: CheckpointProbe._pattern(fake, *a)
    return fake


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rank,index,rows", [(0, 0, 3), (1, 2, 5), (3, 7, 1)])
def test_pattern_is_the_formula(dtype, rank, index, rows):
    first, count = rank * rows * ROW_ELEMS, rows * ROW_ELEMS
    got = CheckpointProbe._pattern(_fake(rank, []), index, first, count, dtype)
    want = ((torch.arange(first, first + count) + 7 * index) % PATTERN_PERIOD).to(dtype)
    assert torch.equal(got, want)
    assert got.untyped_storage().nbytes() == got.numel() * got.element_size()


class _Local:
    def __init__(self, t):
        self.t = t

    def to_local(self):
        return self.t


def test_count_wrong_counts_each_bad_element_object_and_scalar():
    entries = [(None, "step", Item("", "object")),
               (None, "layers.0.weight", Item("", "shard", (4, ROW_ELEMS))),
               ("optim", "00002", Item("optim", "replicate", ())),
               ("optim", "00003", Item("optim", "shard", (6, ROW_ELEMS)))]
    fake = _fake(1, entries)
    fake.state = {"step": 1000, "layers.0.weight": _Local(fake._pattern(1, 0, 2 * ROW_ELEMS, torch.float32).view(2, -1)),
                  "optim": {"00002": torch.tensor(3.0), "00003": _Local(torch.zeros(3, ROW_ELEMS))}}
    loaded = {"step": 1000, "layers.0.weight": _Local(fake.state["layers.0.weight"].t.clone()),
              "optim": {"00002": torch.tensor(3.0), "00003": _Local(torch.zeros(3, ROW_ELEMS))}}
    assert CheckpointProbe._count_wrong(fake, loaded) == 0
    loaded["layers.0.weight"].t[1, :3] = -1
    loaded["optim"]["00003"].t[0, 5] += 1
    loaded["optim"]["00002"] += 1
    loaded["step"] = 0
    assert CheckpointProbe._count_wrong(fake, loaded) == 1 + 3 + 1 + 1
