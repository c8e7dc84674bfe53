"""`microbench nccl --groups world,node,cross` (issue 24): groups a world can form, a launcher's
world of 2 nodes x 2 ranks on loopback (no lab, no root), old records read as group world."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import cli_env, one_error_line
from microbench.accept.compare import compare
from microbench.accept.plots import series
from microbench.core.errors import UsageError
from microbench.probes.nccl.groups import check_groups, expected_for_group
from microbench.probes.nccl.table import groups_side_by_side
from microbench.results import RecordWriter, new_record
from microbench.world.launch import free_port
from microbench.world.topology import topology


# ---------------------------------------------------------------------- pure logic


def test_cross_needs_two_nodes_and_node_two_ranks_per_node():
    with pytest.raises(UsageError, match=r"--groups cross: this world of 4 ranks is one node \(4 ranks per node"):
        check_groups(["world", "cross"], topology(4, {"LOCAL_WORLD_SIZE": "4"}))
    with pytest.raises(UsageError, match=r"--groups node: each of the 4 nodes runs 1 rank"):
        check_groups(["node"], topology(4, {"LOCAL_WORLD_SIZE": "1"}))
    check_groups(["world", "node", "cross"], topology(4, {"LOCAL_WORLD_SIZE": "2"}))


def test_cross_groups_share_the_lab_link_and_node_groups_have_no_line_rate_on_a_lab():
    facts = {"lab": {"name": "hs", "rate_bps": 10**9}}
    topo = topology(4, {"LOCAL_WORLD_SIZE": "2"})
    cross = expected_for_group(facts, "all_reduce", "cross", topo, "cpu", "auto")
    assert cross["gbps"] == pytest.approx(0.125 / 2) and cross["inputs"]["ranks_per_node"] == 2
    assert expected_for_group(facts, "all_reduce", "node", topo, "cpu", "auto")["gbps"] is None


def test_side_by_side_adds_the_cross_groups_that_ran_at_once():
    rows = [{"op": "all_reduce", "size_bytes": 1 << 20, "placement": "in", "group": g, "busbw_gbps": bw}
            for g, bw in (("world", 0.11), ("node", 2.0), ("cross", 0.06))]
    summary = {"topology": {"nodes": 2, "ranks_per_node": 2, "from": "LOCAL_WORLD_SIZE"},
               "groups": {"world": {"ranks": 4, "groups_at_once": 1}, "node": {"ranks": 2, "groups_at_once": 2},
                          "cross": {"ranks": 2, "groups_at_once": 2}}}
    text = groups_side_by_side(rows, summary)
    head, line = text.splitlines()[1:3]
    assert head.split()[1:] == ["op", "size", "world", "node", "cross", "cross", "x2"]
    assert line.split() == ["all_reduce", "1M", "0.110", "2.000", "0.060", "0.120"]


def _nccl_record(path, rows):
    config = {"probe": {"dtype": "float32"}, "world": {"size": 4, "backend": "gloo"}}
    impl = {"backend": "gloo", "device": "cpu", "engine": "torch.distributed/gloo"}
    writer = RecordWriter(new_record("nccl", config, {"hostname": "t"}, impl, argv=["microbench", "nccl"]), path)
    writer.add_rows(rows)
    writer.finish("complete")
    return path


def _row(size, bw, **extra):
    return {"probe": "nccl", "op": "all_reduce", "size_bytes": size, "placement": "in",
            "time_us": {"p50": size / bw / 1e3}, "algbw_gbps": bw, "busbw_gbps": bw * 1.5, **extra}


def test_an_old_record_without_groups_compares_and_plots_as_group_world(tmp_path):
    old = _nccl_record(tmp_path / "old.json", [_row(1 << 20, 1.0)])
    new = _nccl_record(tmp_path / "new.json", [_row(1 << 20, 1.1, group="world"), _row(1 << 20, 5.0, group="node")])
    (pair,) = compare(old, new, []).pairs
    assert [line.ratio for line in pair.lines if line.metric == "busbw_gbps"] == [pytest.approx(1.1)]
    assert pair.only_new == ["all_reduce group=node @ 1M"]
    recorded = json.loads(new.read_text())
    assert set(series(recorded, "busbw_gbps")) == {"all_reduce, world group", "all_reduce, node group"}
    assert set(series(json.loads(old.read_text()), "busbw_gbps")) == {"all_reduce"}


# ---------------------------------------------------------------------- real worlds


def test_groups_cross_on_one_node_exit_2_one_line(cli):
    done = cli("nccl", "--groups", "world,cross", "--sizes", "64K", "--nproc", "2")
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert "--groups cross" in line and "2 ranks is one node" in line


def test_groups_node_under_a_launcher_without_local_size_names_the_variable(cli):
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    done = cli("nccl", "--groups", "node", "--sizes", "64K", env=env, timeout=60)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert "cannot tell the nodes" in line and "LOCAL_WORLD_SIZE" in line


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["torch", "ring"])
def test_a_launchers_two_nodes_of_two_ranks_measure_every_group_correctly(tmp_path, algo):
    """Four ranks started as torchrun would on 2 nodes of 2 (LOCAL_WORLD_SIZE=2): every group's
    results checked element by element, the record's curves per group with the topology."""
    port, out = str(free_port()), tmp_path / "groups.json"
    # The rings cover the three FSDP ops; torch's every op (broadcast's root: the group's first rank).
    checked = ("all_reduce", "reduce_scatter", "all_gather") + (("all_to_all", "broadcast") if algo == "torch" else ())
    ops = ",".join(checked)
    argv = [sys.executable, "-m", "microbench", "nccl", "--groups", "world,node,cross", "--sizes", "48K,96K",
            "--ops", ops, "--algo", algo, "--iters", "2", "--warmup", "1",
            "--json", str(out)]
    procs = [subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=cli_env({"RANK": str(r), "WORLD_SIZE": "4", "LOCAL_RANK": str(r % 2),
                                           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}))
             for r in range(4)]
    results = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], results[0][1]
    record = json.loads(out.read_text())
    # Every node's host, for the fleet to name a node group: here both "nodes" are this machine.
    import socket

    assert record["summary"]["topology"] == {"nodes": 2, "ranks_per_node": 2, "from": "LOCAL_WORLD_SIZE",
                                             "hosts": [socket.gethostname()] * 2}
    assert set(record["summary"]["groups"]) == {"world", "node", "cross"}
    for op in checked:
        for group, ranks in (("world", 4), ("node", 2), ("cross", 2)):
            rows = [r for r in record["rows"] if r["op"] == op and r["group"] == group]
            assert rows and {r["ranks"] for r in rows} == {ranks}, (op, group)
            assert all(r["nwrong"] == 0 for r in rows), (op, group)
            assert op in record["summary"]["groups"][group]["fits"]
    assert record["summary"]["fits"] == record["summary"]["groups"]["world"]["fits"]
    assert "cross x2" in results[0][0]
    assert not os.path.exists(tmp_path / "results")   # --json: nothing else written


def test_the_report_names_each_groups_rows(cli, tmp_path):
    rec = _nccl_record(tmp_path / "nccl.json", [_row(1 << 20, 1.1, group="world"), _row(1 << 20, 5.0, group="node"),
                                                _row(1 << 20, 0.5, group="cross")])
    done = cli("report", str(rec), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    html = (tmp_path / "r.html").read_text()
    assert all(f"all_reduce group={g}" in html for g in ("world", "node", "cross"))
