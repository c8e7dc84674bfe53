"""The checkpoint probe mirroring a real state's layout: the walk in DCP's order, the bytes it
counts, the Shard(0) split, and a real save and load of a mirrored state (one gloo rank)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from microbench.targets import checkpoint_target as ct  # noqa: E402
from microbench.probes import checkpoint as ck  # noqa: E402
from microbench.probes.checkpoint.state_layout import Item, layout_bytes, shard_rows, state_layout, tensor_count  # noqa: E402


@pytest.mark.parametrize("rows,ranks", [(10, 2), (7, 3), (5, 4), (1, 2), (0, 2), (4096, 2)])
def test_shard_rows_split_like_torch_chunk(rows, ranks):
    pieces = [shard_rows(rows, ranks, r) for r in range(ranks)]
    want = [len(c) for c in torch.arange(rows).chunk(ranks)] if rows else []
    assert [n for _s, n in pieces if n] == want
    assert sum(n for _s, n in pieces) == rows
    for (s0, n0), (s1, _n1) in zip(pieces, pieces[1:]):
        assert s1 == min(s0 + n0, rows)   # contiguous, in rank order


@pytest.fixture
def gloo(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield dist
    dist.destroy_process_group()


def _state():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor, Shard

    mesh = init_device_mesh("cpu", (1,))
    dt = lambda *shape: distribute_tensor(torch.ones(*shape), mesh, [Shard(0)])  # noqa: E731
    # shaped like get_state_dict(model, AdamW): sharded params and moments, scalar steps, groups
    return {"model": {"embed.weight": dt(64, 8), "norm.weight": dt(8)},
            "optim": {"state": {"embed.weight": {"step": torch.tensor(3.0), "exp_avg": dt(64, 8)},
                                "norm.weight": {"step": torch.tensor(3.0), "exp_avg": dt(8)}},
                      "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "params": ["embed.weight", "norm.weight"]}]}}


@pytest.mark.slow
def test_state_layout_walks_in_order_and_counts_bytes(gloo):
    items = state_layout(_state())
    assert [(i.group, i.kind, i.shape) for i in items] == [
        ("model", "shard", (64, 8)), ("model", "shard", (8,)),
        ("optim", "replicate", ()), ("optim", "shard", (64, 8)), ("optim", "replicate", ()), ("optim", "shard", (8,)),
        ("optim", "object", ()), ("optim", "object", ()), ("optim", "object", ())]
    assert tensor_count(items) == 6
    # shards once (global), the scalar steps once each, objects nothing
    assert layout_bytes(items, 2) == 4 * (2 * (64 * 8 + 8) + 2)
    # a replicated non-scalar tensor is held by every rank
    assert layout_bytes([Item("g", "replicate", (3, 2))], 4) == 4 * 6 * 4


class _World:
    rank, size, control = 0, 1, None

    def __init__(self, dist):
        self.dist = dist

    def barrier(self):
        self.dist.barrier()


@pytest.mark.slow
def test_probe_saves_and_loads_a_mirrored_state(gloo, tmp_path):
    items = tuple(state_layout(_state()))
    run_dir = ct.RunDir(ct.parse_target(str(tmp_path / "ck")), "run")
    run_dir.create()
    probe = ck.CheckpointProbe(ck.Config(size_bytes=1, target=str(tmp_path), items=items), _World(gloo), run_dir)
    assert probe.size == layout_bytes(list(items), 1) and probe.tensors == 6
    assert list(probe.state) == ["model", "optim"]            # the real top-level keys, so load sorts alike
    shapes = [tuple(v.shape) for v in probe.state["optim"].values() if hasattr(v, "shape")]
    assert shapes == [(), (64, 8), (), (8,)]
    save, load = probe.cases()
    probe.prepare(save)
    probe.run_once(save)
    probe.prepare(load)
    probe.run_once(load)
    assert probe.check(load) == 0
    # the load really wrote the dest: spoil one element and one object, the check sees both
    probe.dest["model"]["00000"].to_local()[0, 0] = -5
    probe.dest["optim"]["00006"] = 0
    assert probe._count_wrong(probe.dest) == 2
    probe.release(load)


def test_default_layout_keys_sort_in_save_order():
    fake = SimpleNamespace(config=ck.Config(size_bytes=12 << 20, target="x", tensors=12), n=2, elem=4)
    keys = [key for _g, key, _i in ck.CheckpointProbe._entries(fake)]
    assert keys[0] == "step" and sorted(keys[1:]) == keys[1:] and len(keys) == 13
