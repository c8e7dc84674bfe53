"""A CPU world's ranks share the cores (issue 20 item 26): each rank of `microbench nccl` sets
its share of torch's threads, as a careful bare loop does, and the record says how many."""

from __future__ import annotations

import json
import os

import pytest


@pytest.mark.slow
def test_each_cpu_rank_takes_its_share_of_the_cores(run_cli, tmp_path):
    done = run_cli("nccl", "--nproc", "2", "--sizes", "1M", "--ops", "all_reduce", "--iters", "1", "--warmup", "0",
                   "--json", "r.json", timeout=180)
    assert done.returncode == 0, done.stderr
    impl = json.loads((tmp_path / "r.json").read_text())["implementation"]
    assert impl["cpu_threads_per_rank"] == max(1, (os.cpu_count() or 1) // 2)
