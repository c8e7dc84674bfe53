"""nccl-tests conventions and the correctness patterns, checked without a world: each
collective is simulated with plain tensor ops on every rank's pattern."""

import pytest
import torch

from microbench.core.errors import UsageError
from microbench.probes import nccl as coll
from microbench.probes.nccl import OPS, count_wrong, effective_size, expected_result, expected_segments, pattern


@pytest.mark.parametrize("op, n, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("reduce_scatter", 2, 0.5), ("reduce_scatter", 8, 0.875),
    ("all_gather", 4, 0.75), ("all_to_all", 8, 0.875), ("broadcast", 8, 1.0), ("all_reduce", 1, 0.0),
])
def test_busbw_factors_are_nccl_tests(op, n, factor):
    assert OPS[op].factor(n) == pytest.approx(factor)


def test_placements_follow_what_torch_offers():
    assert OPS["all_reduce"].placements == ("in",)
    assert OPS["broadcast"].placements == ("in",)
    assert OPS["all_to_all"].placements == ("out",)
    assert OPS["reduce_scatter"].placements == ("out", "in")
    assert OPS["all_gather"].placements == ("out", "in")


@pytest.mark.parametrize("op, size, n, elem, want", [
    ("all_reduce", 1 << 20, 3, 4, 1 << 20),           # not chunked: whole elements only
    ("all_reduce", 1001, 2, 4, 1000),
    ("reduce_scatter", 1 << 20, 3, 4, (1 << 20) // 12 * 12),  # n equal chunks of whole elements
    ("all_gather", 1 << 20, 8, 2, 1 << 20),
    ("all_to_all", 10, 8, 4, 32),                     # never below one element per rank
    ("broadcast", 1, 2, 2, 2),
])
def test_effective_size(op, size, n, elem, want):
    assert effective_size(OPS[op], size, n, elem) == want


def test_pattern_values_and_periodicity():
    p = pattern(7, rank=0, dtype=torch.float32)
    assert p.tolist() == [-1, 0, 1, -1, 0, 1, -1]
    assert pattern(4, rank=1, offset=1, dtype=torch.float32).tolist() == [1, -1, 0, 1]
    assert pattern(5, rank=2, dtype=torch.bfloat16).dtype == torch.bfloat16


def simulate(op, count, n):
    """Each rank's output for `op` computed directly from the definition."""
    inputs = [pattern(count, r, dtype=torch.float64) for r in range(n)]
    chunk = count // n
    total = sum(inputs)
    if op == "all_reduce":
        return [total for _ in range(n)]
    if op == "reduce_scatter":
        return [total[r * chunk:(r + 1) * chunk] for r in range(n)]
    if op == "all_gather":
        gathered = torch.cat([inputs[r][:chunk] for r in range(n)])
        return [gathered for _ in range(n)]
    if op == "all_to_all":
        return [torch.cat([inputs[src][dst * chunk:(dst + 1) * chunk] for src in range(n)]) for dst in range(n)]
    if op == "broadcast":
        return [inputs[0] for _ in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_expected_results_match_the_definition(op, n, dtype):
    count = 24 * n + (0 if OPS[op].chunked else 5)
    for rank, want in enumerate(simulate(op, count, n)):
        got = expected_result(op, count, n, rank, dtype=dtype)
        assert got.dtype == dtype
        assert torch.equal(got.to(torch.float64), want), (op, n, rank)


@pytest.mark.parametrize("op", list(OPS))
def test_count_wrong_counts_exactly_the_corrupted_elements(op):
    n, count = 4, 4 * 25  # 25 elements per chunk: segments do not end on a whole tile
    segments = expected_segments(op, count, n, rank=1)
    good = expected_result(op, count, n, 1, dtype=torch.float32)
    assert count_wrong(good, segments) == 0
    bad = good.clone()
    bad[[0, 7, len(bad) - 1]] += 5
    bad[3] = float("nan")
    assert count_wrong(bad, segments) == 4


def test_expected_rejects_unknown_ops():
    with pytest.raises(UsageError, match="'gather'"):
        expected_result("gather", 8, 2, 0, dtype=torch.float32)


def test_memory_plan_refuses_a_sweep_of_which_nothing_fits_with_the_amount_needed():
    with pytest.raises(UsageError) as info:
        coll.plan_memory(["all_reduce", "all_to_all"], [64 << 30], 2, 8 << 30, "host memory")
    text = str(info.value)
    # all_reduce holds S per rank plus the process: 2 x 64.25 GiB, its smallest case.
    assert text.startswith("no size of --sizes fits in host memory for 2 rank(s): the smallest case, all_reduce "
                           "in-place 64G needs 128.5 GiB, more than the 7.2 GiB of host memory for 2 rank(s) may be "
                           "taken (90% of the 8.0 GiB free)"), text
    assert text.endswith("use e.g. --sizes 1M-1G")   # all_to_all: 2 x (2 x 1G + the process) fits 7.2


def test_memory_refusal_states_the_90_percent_rule_when_the_need_is_below_free():
    from microbench.core.units import memory_shortfall

    # 20 GiB against 22 GiB free: refused because 90% of 22 is 19.8; the message must say so.
    text = memory_shortfall(20 << 30, 22 << 30, "host memory")
    assert text == ("needs about 20.0 GiB of host memory, more than the 19.8 GiB a run may take "
                    "(90% of the 22.0 GiB free)")
    assert memory_shortfall(19 << 30, 22 << 30, "host memory") is None


def test_memory_plan_keeps_everything_when_it_fits():
    assert coll.plan_memory(["all_reduce"], [1 << 20, 64 << 20], 2, 8 << 30, "host memory").skipped == []
    # Our buffers (1 + 1/n) S, gloo's flat staging copy S, the process.
    assert coll.bytes_needed_per_rank(["all_gather"], 1 << 30, 4) == int((1 + 1 / 4 + 1) * (1 << 30)) + coll.PROCESS_BYTES


@pytest.mark.parametrize("name", list(OPS))
def test_each_op_lays_out_its_own_buffers_as_nccl_tests_counts_them(name):
    """A CollOp's buffers: out of place two arenas of its send and receive counts; in place one,
    the send and receive views where its in-place offsets put them; the send view holds the
    rank's pattern."""
    op, n, rank, count = OPS[name], 4, 2, 4 * 6
    c = op.counts(count, n)
    for placement in op.placements:
        arenas = {}

        def arena(role, elements):
            arenas[role] = torch.full((elements,), 7.0)
            return arenas[role]

        send, recv = op.buffers(arena, count, n, rank, placement)
        assert (send.numel(), recv.numel()) == (c.send, c.recv)
        assert torch.equal(send, pattern(c.send, rank, dtype=torch.float32))
        if placement == "in":
            (whole,) = arenas.values()
            assert send.data_ptr() == whole.data_ptr() + c.send_in_place * rank * whole.element_size()
            assert recv.data_ptr() == whole.data_ptr() + c.recv_in_place * rank * whole.element_size()
        else:
            assert set(arenas) == {"send", "recv"} and send.data_ptr() != recv.data_ptr()
        if op.zero_recv and placement == "out":
            assert not recv.any()


def test_a_ring_exists_exactly_for_the_ops_ring_lists():
    assert set(coll.RING_OPS) == {name for name, op in OPS.items() if op.ring_call is not None}
    assert set(coll.RING_OPS) == {"reduce_scatter", "all_gather", "all_reduce"}
