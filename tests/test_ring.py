"""microbench's ring collectives (--algo ring): exact results on 2 and 3 real gloo ranks."""

import json

import pytest

from conftest import last_line


@pytest.mark.slow
@pytest.mark.parametrize("nproc", ["2", "3"])
def test_ring_collectives_are_exact(run_cli, tmp_path, nproc):
    out = tmp_path / f"ring{nproc}.json"
    done = run_cli("nccl", "--algo", "ring", "--sizes", "96K,1M", "--nproc", nproc, "--warmup", "1", "--iters", "3",
                   "--json", str(out), timeout=240)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["implementation"]["algo"] == "ring"
    assert record["implementation"]["engine"].startswith("microbench ring over torch.distributed send/recv")
    rows = record["rows"]
    assert {(r["op"], r["placement"]) for r in rows} == {
        ("reduce_scatter", "out"), ("reduce_scatter", "in"), ("all_gather", "out"), ("all_gather", "in"),
        ("all_reduce", "in")}
    assert all(r["nwrong"] == 0 for r in rows)
    # ring all_reduce needs whole chunks per rank: sizes are rounded down to a multiple of n elements
    assert all(r["count"] % int(nproc) == 0 for r in rows)
    assert "algo ring" in done.stdout


def test_ring_refuses_ops_it_does_not_cover(cli):
    done = cli("nccl", "--algo", "ring", "--ops", "broadcast")
    assert done.returncode == 2
    assert last_line(done.stderr) == ("microbench: --algo ring covers reduce_scatter, all_gather, all_reduce, not "
                                      "broadcast; e.g. --algo ring --ops reduce_scatter,all_gather,all_reduce")
    bad = cli("nccl", "--algo", "tree")
    assert bad.returncode == 2
    assert last_line(bad.stderr) == "microbench: invalid --algo 'tree': expected one of torch, ring (e.g. --algo ring)"
