"""The nccl probe's memory: ops run one at a time, each freeing its buffers
before the next allocates, and the pre-check's need is what the ranks really hold: our buffers,
the backend's staging copy, the process; no phantom buffer for the check. A case that does not
fit is skipped with what it needs (in place where out of place does not fit), the rest run; only
a sweep of which nothing fits is refused (plan.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import cli_env, one_error_line
import microbench.probes.nccl as coll
from microbench.core.units import parse_sizes
from microbench.core.errors import UsageError

GIB = 1 << 30


def test_a_4g_sweep_needs_one_ops_buffers_per_rank_not_a_check_buffer_too():
    # all_reduce works in place in one S-sized buffer; nothing else scales with S.
    assert coll.bytes_needed_per_rank(["all_reduce"], 4 * GIB, 2) == 4 * GIB + coll.PROCESS_BYTES
    # The sweep's need is the largest op's, not the sum over ops.
    both = coll.bytes_needed_per_rank(["all_reduce", "broadcast"], 4 * GIB, 2)
    assert both == coll.bytes_needed_per_rank(["all_reduce"], 4 * GIB, 2)


def _keys(plan):
    return [(s.op, s.size_bytes, s.placement) for s in plan.skipped]


def test_on_a_24_gib_machine_4g_runs_in_place_and_skips_only_out_of_place():
    """The issue's box: 22.6 GiB free, 20.3 GiB a run may take. Out of place at 4G needs 20.5 GiB
    (our buffers 1.5 S, gloo's staging S, the process); in place 16.5 GiB: it runs."""
    plan = coll.plan_memory(list(coll.DEFAULT_OPS), parse_sizes("1M-4G"), 2, int(22.6 * GIB), "host memory")
    assert _keys(plan) == [("reduce_scatter", 4 * GIB, "out"), ("all_gather", 4 * GIB, "out")]
    assert [s.need_bytes for s in plan.skipped] == [int(20.5 * GIB)] * 2
    assert plan.cases == 13 * 5      # 13 sizes: reduce_scatter and all_gather both placements, all_reduce one
    # Each skip says what it needs; the plan says what may be taken.
    assert plan.skipped[0].words() == "reduce_scatter out-of-place 4G needs 20.5 GiB"
    assert plan.why() == "20.3 GiB of host memory for 2 rank(s) may be taken (90% of the 22.6 GiB free)"


def test_the_in_place_case_kept_does_not_carry_the_out_of_place_buffer():
    # The arenas are sized per role by the cases kept: in place at 4G beside out of place at 2G
    # holds S (send) + S/2 of 2G (recv) + S (staging), not S/2 of 4G.
    kept = [(2 * GIB, "out"), (4 * GIB, "in")]
    assert coll.plan.op_peak_bytes("reduce_scatter", kept, 2, "gloo") == (4 + 1 + 4) * GIB + coll.PROCESS_BYTES


@pytest.mark.parametrize("free_gib, skipped", [
    (64.0, []),
    (22.6, [("reduce_scatter", 4, "out"), ("all_gather", 4, "out")]),
    (18.0, [("reduce_scatter", 4, "out"), ("reduce_scatter", 4, "in"), ("all_gather", 4, "out"),
            ("all_gather", 4, "in")]),
    # 4.25 GiB of buffers a rank: in place 2G would hold send 2 + the 1G out-of-place chunk 0.5 + staging 2
    (10.0, [("reduce_scatter", 2, "out"), ("reduce_scatter", 2, "in"), ("reduce_scatter", 4, "out"),
            ("reduce_scatter", 4, "in"), ("all_gather", 2, "out"), ("all_gather", 2, "in"), ("all_gather", 4, "out"),
            ("all_gather", 4, "in")]),   # all_reduce 4G: 2 x 4.25 GiB fits
])
def test_the_plan_skips_the_largest_cases_out_of_place_first(free_gib, skipped):
    plan = coll.plan_memory(list(coll.DEFAULT_OPS), [1 << 20, GIB, 2 * GIB, 4 * GIB], 2, int(free_gib * GIB),
                            "host memory")
    assert _keys(plan) == [(op, size * GIB, placement) for op, size, placement in skipped]


def test_a_sweep_of_which_nothing_fits_is_refused_before_any_work():
    with pytest.raises(UsageError) as info:
        coll.plan_memory(["all_reduce"], [4 * GIB], 2, 8 * GIB, "host memory")
    assert "no size of --sizes fits in host memory for 2 rank(s)" in str(info.value)
    assert str(info.value).endswith("use e.g. --sizes 1M-2G")


def test_gpu_memory_is_one_ranks_own():
    # 8 ranks, each its own GPU: out of place at 8G holds 8G + its 1G chunk; NCCL stages nothing.
    plan = coll.plan_memory(["all_gather"], [GIB, 8 * GIB], 1, 10 * GIB, "GPU memory of rank 0", world=8)
    assert _keys(plan) == [("all_gather", 8 * GIB, "out")]
    assert "GPU memory of rank 0 may be taken" in plan.why()


def test_nccl_gpu_memory_has_no_gloo_staging():
    assert coll.bytes_needed_per_rank(["all_gather"], GIB, 2, backend="nccl") == int(1.5 * GIB) + coll.PROCESS_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("op", ["all_gather", "all_reduce"])
def test_the_pre_check_agrees_with_what_a_rank_really_holds(op, tmp_path):
    """Each rank's peak resident set (ru_maxrss over every process the command started) against
    the pre-check's need per rank at 256 MiB: measured below the need, and not far below."""
    size = 256 << 20
    probe = ("import resource, subprocess, sys\n"
             "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
             "assert done.returncode == 0, done.stderr\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n")
    done = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "microbench", "nccl", "--sizes", "256M",
                           "--ops", op, "--iters", "1", "--warmup", "0", "--json", str(tmp_path / "r.json")],
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    measured = int(done.stdout.strip().splitlines()[-1])
    need = coll.bytes_needed_per_rank([op], size, 2)
    assert 0.8 * need <= measured <= need, (measured, need)


# ----------------------------------------------------------------------- the real run, a small budget
BUDGET = {"MICROBENCH_TEST_FREE_MEMORY": "900M"}   # 810 MiB may be taken: out of place at 64M needs 832 MiB


@pytest.mark.slow
def test_a_sweep_whose_largest_cases_do_not_fit_runs_the_rest_and_says_what_it_skipped(run_cli, tmp_path):
    done = run_cli("nccl", "--sizes", "1M-64M", "--iters", "2", "--warmup", "0", "--json", "r.json", env=BUDGET)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    # In each table, the size's line with the skipped placement marked, and why under it.
    lines = [line for line in out.splitlines() if line.strip().startswith("67108864")]
    assert len(lines) == 3 and sum(" skipped " in line for line in lines) == 2, lines
    why = ("# skipped out-of-place at 67108864 B: needs 832.0 MiB; 810.0 MiB of host memory for 2 rank(s) may be "
           "taken (90% of the 900.0 MiB free)")
    assert out.count(why) == 2, out
    # The closing line, just before the record's path.
    closing = out.strip().splitlines()[-2]
    assert closing == ("# skipped 2 case(s) that do not fit in memory (810.0 MiB of host memory for 2 rank(s) may be "
                       "taken (90% of the 900.0 MiB free)): reduce_scatter out-of-place 64M needs 832.0 MiB; "
                       "all_gather out-of-place 64M needs 832.0 MiB; every other size and placement ran"), closing
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["status"] == "complete"
    skipped = record["summary"]["skipped"]
    assert skipped["reason"].startswith("does not fit in memory: 810.0 MiB of host memory")
    assert [(c["op"], c["size_bytes"], c["placement"], c["need_bytes"]) for c in skipped["cases"]] == [
        ("reduce_scatter", 64 << 20, "out", 832 << 20), ("all_gather", 64 << 20, "out", 832 << 20)]
    ran = {(r["op"], r["size_bytes"], r["placement"]) for r in record["rows"]}
    assert len(ran) == 7 * 5 - 2
    assert ("reduce_scatter", 64 << 20, "in") in ran and ("reduce_scatter", 64 << 20, "out") not in ran


def test_a_sweep_of_which_nothing_fits_is_refused_with_exit_2_and_nothing_written(cli, tmp_path):
    done = cli("nccl", "--sizes", "1M-64M", "--json", "r.json", env={"MICROBENCH_TEST_FREE_MEMORY": "300M"})
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert line.startswith("microbench: no size of --sizes fits in host memory for 2 rank(s): the smallest case, "
                           "all_reduce in-place 1M needs 514.0 MiB"), line
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "results").exists()


def test_the_printed_table_marks_a_skipped_placement_and_a_wholly_skipped_size():
    from microbench.probes.nccl.table import collective_table

    rows = [{"op": "all_gather", "size_bytes": s, "count": s // 4, "dtype": "float32", "redop": "none", "root": -1,
             "placement": p, "time_us": {"p50": 10.0}, "algbw_gbps": 1.0, "busbw_gbps": 0.5, "nwrong": 0}
            for s in (1 << 20, 2 << 20) for p in ("out", "in") if (s, p) != (2 << 20, "out")]
    skipped = {2 << 20: {"out": "needs 3 GiB"}, 4 << 20: {"out": "needs 5 GiB", "in": "needs 4 GiB"}}
    text = collective_table("all_gather", rows, None, skipped=skipped)
    body = [line for line in text.splitlines() if not line.startswith("#")]
    assert [line.split()[0] for line in body] == ["1048576", "2097152", "4194304"]
    assert body[1].split()[5] == "skipped" and body[1].split()[9] == "10.0"
    assert body[2].split()[5:] == ["skipped", "-", "-", "-", "skipped", "-", "-", "-"]
    assert "# skipped out-of-place at 4194304 B: needs 5 GiB" in text and "# skipped in-place at 4194304 B: needs 4 GiB" in text
