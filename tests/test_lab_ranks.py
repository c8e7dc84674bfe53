"""Several ranks per lab host (issue 24): the nodes of a world from the launcher's local world
size, the lab's placement of consecutive ranks per host, and the real lab with hunt and nccl on it."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from conftest import one_error_line, records, start_nccl_sweep

from microbench.core.errors import UsageError
from microbench.lab import namespaces as labmod
from microbench.lab import parsers as labparse
from microbench.lab.placement import lab_ranks
from microbench.world.topology import machine_ranks, topology

# ---------------------------------------------------------------------- pure logic


@pytest.mark.parametrize("env,size,nodes,per_node", [
    ({"LOCAL_WORLD_SIZE": "2"}, 4, 2, 2),
    ({"SLURM_NTASKS_PER_NODE": "4"}, 8, 2, 4),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 16, 2, 8),
    ({"MPI_LOCALNRANKS": "1"}, 3, 3, 1),
    # torchrun's own variable wins over a scheduler's, as the ranks were started by torchrun.
    ({"LOCAL_WORLD_SIZE": "2", "SLURM_NTASKS_PER_NODE": "1"}, 4, 2, 2),
])
def test_topology_from_the_launchers_local_world_size(env, size, nodes, per_node):
    topo = topology(size, env)
    assert (topo.nodes, topo.ranks_per_node) == (nodes, per_node)
    assert [topo.node_of(r) for r in range(size)] == [r // per_node for r in range(size)]


def test_node_and_cross_groups_of_two_by_two():
    topo = topology(4, {"LOCAL_WORLD_SIZE": "2"})
    assert topo.node_groups() == [[0, 1], [2, 3]]
    assert topo.cross_groups() == [[0, 2], [1, 3]]


def test_topology_without_a_local_world_size_names_the_variable_to_set():
    with pytest.raises(UsageError, match=r"cannot tell the nodes of this world of 4 ranks.*LOCAL_WORLD_SIZE=8"):
        topology(4, {})


def test_topology_local_size_that_does_not_divide_names_the_numbers():
    with pytest.raises(UsageError, match=r"LOCAL_WORLD_SIZE=3 ranks per node does not divide the world of 4"):
        topology(4, {"LOCAL_WORLD_SIZE": "3"})


def test_machine_ranks_prefer_everything_launched_here():
    assert machine_ranks({"MICROBENCH_MACHINE_RANKS": "4", "LOCAL_WORLD_SIZE": "2"}) == 4
    assert machine_ranks({"LOCAL_WORLD_SIZE": "2"}) == 2
    assert machine_ranks({}) == 1


def test_lab_places_consecutive_ranks_per_host_with_their_nodes_local_rank():
    lab = labmod.Lab("x", hosts=[labmod.LabHost(i, f"mb-x-h{i}", f"10.213.0.{i + 1}", rate_bps=10**9)
                                 for i in range(3)], rate_bps=10**9, ranks_per_host=2)
    nproc, master, per_rank = lab_ranks(lab, [0, 1])
    assert (nproc, master) == (4, "10.213.0.1")
    launches = [per_rank(r) for r in range(4)]
    assert [launch.prefix[-1] for launch in launches] == ["mb-x-h0", "mb-x-h0", "mb-x-h1", "mb-x-h1"]
    assert [launch.env["LOCAL_RANK"] for launch in launches] == ["0", "1", "0", "1"]
    assert {launch.env["LOCAL_WORLD_SIZE"] for launch in launches} == {"2"}
    assert [launch.env["MICROBENCH_DEVICE_INDEX"] for launch in launches] == ["0", "1", "2", "3"]
    # Each host is its own node to NCCL, which would otherwise join them over shared memory.
    assert [launch.env["NCCL_HOSTID"] for launch in launches] == ["mb-x-h0", "mb-x-h0", "mb-x-h1", "mb-x-h1"]


def test_ranks_per_host_parse_refuses_what_this_machine_cannot_run(monkeypatch):
    import microbench.world.supervisor as supervisor

    monkeypatch.setattr(supervisor, "local_world_limit", lambda: (6, "8 per CPU core x 1 core(s)"))
    assert labparse.parse_ranks_per_host("3", 2) == 3
    with pytest.raises(UsageError, match=r"--ranks-per-host 4: 2 hosts x 4 = 8 ranks.*at most 6 local ranks"):
        labparse.parse_ranks_per_host("4", 2)
    for text in ("0", "-1", "two", ""):
        with pytest.raises(UsageError, match="expected a whole number of ranks per host"):
            labparse.parse_ranks_per_host(text, 2)


@pytest.mark.parametrize("value,needle", [("0", "'0'"), ("abc", "'abc'"), ("10000", "2 hosts x 10000 = 20000 ranks")])
def test_lab_up_bad_ranks_per_host_exit_2_one_line(cli, value, needle):
    done = cli("lab", "up", "--hosts", "2", "--ranks-per-host", value, "--name", "i24never")
    assert done.returncode == 2
    assert needle in one_error_line(done.stderr)


# ---------------------------------------------------------------------- a real lab (root)


@pytest.mark.slow
@pytest.mark.root
def test_lab_with_two_ranks_per_host_runs_nccl_groups_and_hunt(run_cli, lab_name, tmp_path):
    up = run_cli("lab", "up", "--hosts", "2", "--ranks-per-host", "2", "--link", "1gbit", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    assert "2 hosts x 2 ranks" in up.stdout
    status = json.loads(run_cli("lab", "status", "--name", lab_name, "--json").stdout)
    assert status[0]["ranks_per_host"] == 2 and len(status[0]["hosts"]) == 2
    # Asking for the same lab again changes nothing; another ranks-per-host under the name is refused.
    assert run_cli("lab", "up", "--hosts", "2", "--ranks-per-host", "2", "--name", lab_name).returncode == 0
    again = run_cli("lab", "up", "--hosts", "2", "--ranks-per-host", "1", "--name", lab_name)
    assert again.returncode == 2 and "2 hosts x 2 rank(s)" in one_error_line(again.stderr)

    odd = run_cli("nccl", "--lab", lab_name, "--nproc", "3", "--sizes", "64K")
    assert odd.returncode == 2
    assert "--nproc 3" in one_error_line(odd.stderr) and "2 ranks on each of its 2 hosts" in odd.stderr

    done = run_cli("nccl", "--lab", lab_name, "--groups", "world,node,cross", "--sizes", "64K,256K",
                   "--ops", "all_reduce", "--iters", "3", "--warmup", "1")
    assert done.returncode == 0, done.stderr
    (record,) = records(tmp_path, "nccl-*.json")
    assert record["config"]["world"]["size"] == 4
    # Each lab host by its name in the lab (h0, h1): what hunt and the fleet call it.
    assert record["summary"]["topology"] == {"nodes": 2, "ranks_per_node": 2, "from": "LOCAL_WORLD_SIZE",
                                             "hosts": ["h0", "h1"]}
    by_group = {g: [r for r in record["rows"] if r["group"] == g] for g in ("world", "node", "cross")}
    assert {r["ranks"] for r in by_group["world"]} == {4}
    assert {(r["ranks"], r["groups_at_once"]) for r in by_group["node"] + by_group["cross"]} == {(2, 2)}
    assert all(r["nwrong"] == 0 for r in record["rows"])
    # The hosts' ranks meet over their loopback (no line rate); across hosts the link, shared.
    expected = record["summary"]["expected_groups"]
    assert "loopback" in expected["node"]["all_reduce"]["unknown_why"]
    assert expected["cross"]["all_reduce"]["gbps"] == pytest.approx(10**9 / 8 / 1e9 / 2)
    assert "cross x2" in done.stdout

    # The link probe measures between two hosts, not two ranks of one host's loopback.
    link = run_cli("link", "--lab", lab_name, "--sizes", "256K", "--ops", "uni", "--iters", "2")
    assert link.returncode == 0, link.stderr
    (linked,) = records(tmp_path, "link-*.json")
    assert [h.split()[0] for h in linked["config"]["probe"]["hosts"]] == [f"mb-{lab_name}-h0", f"mb-{lab_name}-h1"]


@pytest.mark.slow
@pytest.mark.root
def test_hunt_takes_the_hosts_of_a_lab_with_two_ranks_per_host(run_cli, lab_name, tmp_path):
    from microbench.core.units import parse_link_rate

    labmod.up(lab_name, 3, parse_link_rate("1gbit"), ranks_per_host=2)
    hunt = run_cli("hunt", "--lab", lab_name, "--size", "4M", "--iters", "2")
    # Exit 1 is a verdict (a host slow on this loaded machine), not a failure to run on the lab.
    assert hunt.returncode in (0, 1) and "decided by" in hunt.stdout, hunt.stderr
    (hunted,) = records(tmp_path, "hunt-*.json")
    assert hunted["status"] == "complete" and hunted["config"]["hosts"] == ["h0", "h1", "h2"]
    assert hunted["config"]["ranks_per_host"] == {"h0": 2, "h1": 2, "h2": 2}


@pytest.fixture
def h7b_lab(lab_name):
    from microbench.lab import namespaces as labmod

    labmod.up(lab_name, 2, None)
    return lab_name  # lab_name takes it down again


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("host", [0, 1])
def test_a_link_down_in_the_lab_is_blamed_on_its_host(tmp_path, h7b_lab, host):
    proc = start_nccl_sweep(tmp_path, lab=h7b_lab)
    subprocess.run(["ip", "link", "set", f"mb-{h7b_lab}-v{host}", "down"], check=True)
    down_at = time.monotonic()
    out, err = proc.communicate(timeout=60)
    elapsed = time.monotonic() - down_at
    assert proc.returncode == 1
    line = one_error_line(err)
    if host == 0:
        assert "rank 0 lost its own network link (lab0 is" in line and "rank 1 unreachable" in line
        assert "rank 1 died" not in line
    else:
        assert "rank 1 died or stopped responding" in line
    assert f"lab host mb-{h7b_lab}-h{host} " in line and "(partial)" in line
    assert elapsed < 5 + 3, elapsed  # --timeout, a second of heartbeats, the lab's own diagnosis
    (record,) = records(tmp_path)
    assert record["status"] == "partial"
