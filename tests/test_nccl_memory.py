"""The nccl probe's memory (issue 20 item 24): ops run one at a time, each freeing its buffers
before the next allocates, and the pre-check's need is what the ranks really hold: our buffers,
the backend's staging copy, the process; no phantom buffer for the check."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import cli_env
import microbench.probes.nccl as coll
from microbench.core.errors import UsageError

GIB = 1 << 30


def test_a_4g_sweep_needs_one_ops_buffers_per_rank_not_a_check_buffer_too():
    # all_reduce works in place in one S-sized buffer; nothing else scales with S.
    assert coll.bytes_needed_per_rank(["all_reduce"], 4 * GIB, 2) == 4 * GIB + coll.PROCESS_BYTES
    # The sweep's need is the largest op's, not the sum over ops.
    both = coll.bytes_needed_per_rank(["all_reduce", "broadcast"], 4 * GIB, 2)
    assert both == coll.bytes_needed_per_rank(["all_reduce"], 4 * GIB, 2)


def test_on_a_24_gib_machine_the_4g_refusal_names_each_ops_need_and_what_fits():
    free = int(21.6 * GIB)    # this machine's free memory, idle
    coll.check_memory(["all_reduce"], [1 << 20, 4 * GIB], 2, free, "host memory")
    with pytest.raises(UsageError) as info:
        coll.check_memory(["reduce_scatter", "all_gather", "all_reduce"], [1 << 20, 4 * GIB], 2, free, "host memory")
    text = str(info.value)
    assert "per rank: reduce_scatter 10.2 GiB, all_gather 10.2 GiB, all_reduce 4.2 GiB" in text
    assert text.endswith("e.g. --sizes 1M-2G or only --ops all_reduce")


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
