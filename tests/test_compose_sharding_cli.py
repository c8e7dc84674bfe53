"""`microbench compose` with two networks and --sharding / --scale-nodes (issue 24): the
acceptance command, grouped nccl records, and the refusals (exit 2, one line)."""

import json

import pytest

from conftest import one_error_line
from test_compose_sharding import grouped_record

JOB = ("--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "h100")


def _rows(stdout: str, title: str) -> dict[tuple[str, str], list[str]]:
    """{(sharding, network): the row's cells} of the table under `## title`."""
    table = stdout.split(f"## {title}", 1)[1].split("\n\n", 1)[0]
    out = {}
    for line in table.splitlines()[3:]:
        if line.startswith("#") or not line.strip():
            break
        cells = [c for c in line.split("  ") if c.strip()]
        out[(cells[0].strip(), cells[1].strip())] = [c.strip() for c in cells[2:]]
    return out


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"ms": 1e-3, "s": 1.0, "min": 60.0}[unit]


def test_the_acceptance_command_prints_both_strategies_with_memory_verdicts(cli, tmp_path):
    proc = cli("compose", *JOB, "--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--sharding", "full,hybrid",
                   "--json", "c.json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout, "what-if: sharding x network (2 nodes x 8 ranks)")
    full, hybrid = rows[("full", "inter 1.2GB/s")], rows[("hybrid:8", "inter 1.2GB/s")]
    assert full[4] == "fits: 32.8 GB of 72.0 GB" and hybrid[4] == "fits: 40.9 GB of 72.0 GB"
    # Full sharding moves AllGather (twice) and ReduceScatter over 16 ranks through the 1.2 GB/s
    # NICs: 3 x 15/16 x 16 GB / 1.2 GB/s = 37.5 s, mostly exposed; hybrid only all-reduces its
    # shard across the 2 nodes: 2 x 1/2 x 16 GB / 1.2 GB/s = 13.4 s.
    assert 35 < _seconds(full[0]) < 38 and 13 < _seconds(hybrid[0]) < 14.5
    assert hybrid[5] == "1.00x" and full[5].startswith("2.6")
    record = json.loads((tmp_path / "c.json").read_text())
    sharding = {r["strategy"]: r for r in record["rows"] if r["op"] == "sharding"}
    assert set(sharding) == {"full", "hybrid:8"} and sharding["hybrid:8"]["replicas"] == 2
    assert sharding["hybrid:8"]["fits_in_memory"] is True
    assert "one node to the others 1.20 GB/s" in proc.stdout


def test_hybrid_that_does_not_fit_says_so_and_is_not_the_best(cli):
    proc = cli("compose", *JOB, "--net-intra", "360GB/s", "--net-inter", "ib=400GB/s", "--sharding",
                   "full,hybrid:1", "--json", "c.json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout, "what-if: sharding x network")
    assert rows[("hybrid:1", "ib")][4].startswith("DOES NOT FIT: 153.3 GB of 72.0 GB")
    assert rows[("full", "ib")][5] == "1.00x"
    assert ("# hybrid:1 keeps 128.5 GB of fp32 params, grads and AdamW per GPU (16x full sharding's 8.0 GB); "
            "it DOES NOT FIT: a larger shard group") in proc.stdout


def test_a_one_level_net_keeps_its_meaning(cli):
    one = cli("compose", *JOB, "--net", "eth=1.2GB/s", "--json", "a.json", timeout=120)
    two = cli("compose", *JOB, "--net-intra", "360GB/s", "--net-inter", "eth=1.2GB/s", "--json", "b.json",
                  timeout=120)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    step = [line for line in one.stdout.splitlines() if line.startswith("step (overlapped)")]
    assert step == [line for line in two.stdout.splitlines() if line.startswith("step (overlapped)")]
    assert "sharding x network" not in one.stdout


def test_a_grouped_record_full_on_its_world_curve_hybrid_on_its_groups(cli, tmp_path):
    record = dict(grouped_record(nodes=2, per_node=4), schema_version=1, environment={})
    (tmp_path / "n.json").write_text(json.dumps(record))
    proc = cli("compose", "--model", "llama-3.1-8b", "--nodes", "2", "--gpus-per-node", "4", "--gpu", "h100",
                   "--nccl", "lab=n.json", "--sharding", "full,hybrid", "--scale-nodes", "2,16", "--json", "c.json",
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("lab hybrid:4: allreduce as a reduce_scatter and an all_gather: on the inter level (lab:cross), "
            "cross groups as measured") in proc.stdout
    assert "one node to the others 2.00 GB/s" in proc.stdout        # 4 cross groups of 0.5 GB/s at once
    rows = _rows(proc.stdout, "what-if: sharding x network (2 nodes x 4 ranks)")
    # full sharding on the world curve (2 GB/s), as the one-level step table: 3 x 7/8 x 16 GB / 2 GB/s
    step_table = next(line for line in proc.stdout.splitlines() if line.startswith("step (overlapped)"))
    assert rows[("full", "lab")][0] == step_table.split()[-2] + " " + step_table.split()[-1]
    assert 19 < _seconds(rows[("full", "lab")][0]) < 22 and 7.5 < _seconds(rows[("hybrid:4", "lab")][0]) < 9
    scaled = proc.stdout.split("## what-if at other node counts", 1)[1]
    assert "# method: scaled from the same curves: each level's fitted latency and peak busbw" in scaled
    lines = {tuple(line.split()[:4]): line.split()[4:6] for line in scaled.splitlines() if line[:1].isdigit()}
    assert lines[("2", "8", "full", "lab")] == rows[("full", "lab")][0].split()   # the job's count: as above
    # 16 nodes: hybrid's all-reduce crosses 16 nodes (2 x 15/16 x 16 GB / 2 GB/s = 15 s)
    assert 14.5 < _seconds(" ".join(lines[("16", "64", "hybrid:4", "lab")])) < 16


@pytest.mark.parametrize("args, fragment", [
    (("--net-intra", "360GB/s", "--sharding", "full,hybrid"),
     "--net-intra needs --net-inter: the two levels go together (the NVLink bus bandwidth inside a node and one "
     "node's NICs to the others), e.g. --net-intra 360GB/s --net-inter 1.25GB/s"),
    (("--net-inter", "1.2GB/s"), "--net-inter needs --net-intra"),
    (("--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--sharding", "hybrid:3"),
     "--sharding hybrid:3: a shard group of 3 ranks does not divide the world of 16 ranks (2 nodes x 8)"),
    (("--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--sharding", "hybrid:32"),
     "--sharding hybrid:32: a shard group of 32 ranks is larger than the world of 16 ranks (2 nodes x 8)"),
    (("--net", "eth=1.2GB/s", "--sharding", "full,hybrid"), "--sharding full,hybrid needs two networks"),
    (("--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--sharding", "zero3"), "invalid --sharding 'zero3'"),
    (("--net-intra", "360GB/s", "--net-inter", "1.2GB/s", "--scale-nodes", "2,x"), "--scale-nodes"),
    (("--net-intra", "fastGB/s", "--net-inter", "1.2GB/s"), "--net-intra bandwidth"),
])
def test_bad_input_exits_2_with_one_line(cli, args, fragment):
    proc = cli("compose", *JOB, *args, timeout=120)
    assert proc.returncode == 2
    assert fragment in one_error_line(proc.stderr)
    assert "## " not in proc.stdout          # refused before any table


def test_two_levels_need_the_nodes(cli):
    proc = cli("compose", "--ranks", "16", "--gpu", "h100", "--net-intra", "360GB/s", "--net-inter", "1.2GB/s",
                   timeout=120)
    assert proc.returncode == 2
    assert "need the job's nodes: give --nodes and --gpus-per-node" in one_error_line(proc.stderr)
