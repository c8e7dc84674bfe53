"""microbench hunt and the lab's per-host / per-link shaping: pure logic, bad input, and the lab."""

from __future__ import annotations

import itertools
import json

import pytest
from conftest import last_line, one_error_line

from microbench.core.errors import UsageError
from microbench.lab import hunt
from microbench.lab import shaping as labshape

NAMES = ["h0", "h1", "h2", "h3"]


def full(n: int, value: float = 0.12) -> dict[tuple[int, int], float]:
    return {(i, j): value for i in range(n) for j in range(n) if i != j}


# ---------------------------------------------------------------------- schedule


@pytest.mark.parametrize("n", range(3, 11))
def test_rounds_cover_every_pair_once_with_disjoint_pairs(n):
    schedule = hunt.rounds(n)
    assert len(schedule) == (n - 1 if n % 2 == 0 else n)
    seen = [pair for pairs in schedule for pair in pairs]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for pairs in schedule:
        hosts = [h for pair in pairs for h in pair]
        assert len(hosts) == len(set(hosts))
        assert len(pairs) == n // 2


# ---------------------------------------------------------------------- judgement


def test_a_host_slow_only_when_sending_is_named_alone():
    matrix = full(4)
    for peer in (0, 1, 3):
        matrix[(2, peer)] = 0.012
    verdict = hunt.analyze(matrix, NAMES, 0.7)
    assert verdict.hosts == [2] and verdict.links == []
    assert verdict.lines[0].startswith("SLOW HOST h2: slow with every peer, sending (egress)")


def test_a_slow_link_between_healthy_hosts_is_named_and_its_ends_are_not():
    matrix = full(4)
    matrix[(0, 1)] = matrix[(1, 0)] = 0.012
    verdict = hunt.analyze(matrix, NAMES, 0.7)
    assert verdict.hosts == [] and verdict.links == [(0, 1)]
    assert verdict.lines == [line for line in verdict.lines if line.startswith("SLOW LINK h0 <-> h1")]


def test_links_of_a_bad_host_are_blamed_on_the_host_not_listed_as_links():
    matrix = full(5)
    for peer in (0, 1, 3, 4):
        matrix[(2, peer)] = matrix[(peer, 2)] = 0.01
    matrix[(3, 4)] = 0.02   # and one more bad link elsewhere
    verdict = hunt.analyze(matrix, NAMES + ["h4"], 0.7)
    assert verdict.hosts == [2] and verdict.links == [(3, 4)]
    assert "sending and receiving" in verdict.lines[0]


def test_clean_cluster_and_the_absolute_floor():
    matrix = full(4)
    matrix[(0, 1)] = 0.1   # 0.83 x median: not slow at 0.7
    clean = hunt.analyze(matrix, NAMES, 0.7)
    assert clean.clean and clean.lines[0].startswith("OK: every link reaches")
    floored = hunt.analyze(matrix, NAMES, 0.7, floor_gbps=0.11)
    assert floored.links == [(0, 1)] and floored.threshold_gbps == 0.11
    everything = hunt.analyze(matrix, NAMES, 0.7, floor_gbps=10.0)
    assert everything.hosts == [0, 1, 2, 3] and everything.lines[0].startswith("ALL SLOW")


def test_fewer_than_three_hosts_is_refused_with_the_reason():
    with pytest.raises(UsageError, match="at least 3 hosts.*cannot be blamed on either end"):
        hunt.analyze(full(2), NAMES[:2], 0.7)


def test_matrix_table_marks_slow_cells():
    matrix = full(3)
    matrix[(1, 2)] = 0.01
    rows = hunt.matrix_table(matrix, NAMES[:3], {(1, 2)})
    assert rows[1] == ["h1", "0.12", "-", "0.01 *"]


# ---------------------------------------------------------------------- shaping plans


def test_host_and_pair_link_parsing():
    assert labshape.parse_host_links(["h2=100mbit"], 4) == {2: 10**8}
    assert labshape.parse_host_links(["h1=1gbit,h3=unlimited"], 4) == {1: 10**9, 3: None}
    assert labshape.parse_pair_links(["h1-h0=100mbit"], 4) == {(0, 1): 10**8}


@pytest.mark.parametrize("call,needle", [
    (lambda: labshape.parse_host_links(["2=100mbit"], 4), "expected hINDEX=RATE"),
    (lambda: labshape.parse_host_links(["h4=100mbit"], 4), "hosts h0 to h3"),
    (lambda: labshape.parse_host_links(["h2=fast"], 4), "invalid --host-link rate 'fast'"),
    (lambda: labshape.parse_pair_links(["h0-h0=100mbit"], 4), "two different hosts"),
    (lambda: labshape.parse_pair_links(["h0=100mbit"], 4), "expected hA-hB=RATE"),
])
def test_bad_shaping_specs(call, needle):
    with pytest.raises(UsageError, match=needle):
        call()


def test_htb_plan_sends_only_the_peer_through_the_slow_class():
    plan = labshape.Shaping(10**9, {}, {(0, 1): 10**8})
    assert plan.links_from(0) == [(1, 10**8)] and plan.links_from(1) == [(0, 10**8)] and plan.links_from(2) == []
    cmds = labshape.htb_commands("mb-x-h0", 10**9, [("10.213.0.2", 10**8)])
    default = next(c for c in cmds if "1:2" in c)
    assert default[default.index("rate") + 1] == "1000000000bit"
    link = next(c for c in cmds if "1:10" in c and "class" in c)
    assert link[link.index("rate") + 1] == "100000000bit"
    flt = next(c for c in cmds if "filter" in c)
    assert flt[flt.index("dst") + 1] == "10.213.0.2/32" and flt[-1] == "1:10"
    shown = ("qdisc htb 1: root refcnt 3 r2q 10 default 0x2 class htb 1:10 root prio 0 rate 100Mbit ceil 100Mbit "
             "class htb 1:2 root prio 0 rate 1Gbit ceil 1Gbit burst 1250000b")
    assert labshape.parse_htb_rate(shown) == 10**9


# ---------------------------------------------------------------------- the command


@pytest.mark.parametrize("args,needle", [
    ([], "hunt runs across hosts: give --lab NAME"),
    (["--lab", "x", "--slow", "1.5"], "invalid --slow '1.5'"),
    (["--lab", "x", "--slow", "nan"], "invalid --slow 'nan'"),
    (["--lab", "x", "--floor", "10"], "invalid --floor '10'"),
    (["--lab", "x", "--size", "0"], "--size"),
    (["--lab", "x", "--json", "exists.json"], "invalid --json 'exists.json': it exists"),
])
def test_hunt_bad_input_exit_2_one_line(cli, tmp_path, args, needle):
    (tmp_path / "exists.json").write_text("{}")
    done = cli("hunt", *args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and needle in last_line(done.stderr), done.stderr


@pytest.mark.slow
@pytest.mark.root
def test_hunt_on_two_hosts_says_why_not(cli, lab):
    done = cli("hunt", "--lab", lab.name)
    assert done.returncode == 2
    assert "hunt needs at least 3 hosts, lab" in last_line(done.stderr) and len(done.stderr.strip().splitlines()) == 1


def _hunt(run_cli, name, tmp_path, tag):
    record = tmp_path / f"hunt-{tag}.json"
    done = run_cli("hunt", "--lab", name, "--json", str(record), timeout=240)
    data = json.loads(record.read_text())
    return done, data


@pytest.mark.slow
@pytest.mark.root
def test_hunt_names_the_slow_host_then_the_slow_link_and_nothing_else(run_cli, lab_name, tmp_path):
    up = run_cli("lab", "up", "--hosts", "4", "--link", "1gbit", "--host-link", "h2=100mbit", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    assert "except h2 at 100mbit" in up.stdout

    done, data = _hunt(run_cli, lab_name, tmp_path, "host")
    assert done.returncode == 1, done.stderr
    assert last_line(done.stderr) == "microbench: hunt found slow host h2 (verdict and matrix above)"
    assert data["summary"]["slow_hosts"] == ["h2"] and data["summary"]["slow_links"] == []
    assert len(data["rows"]) == 12 and data["summary"]["rounds"] == 3
    assert sorted(r["src"] for r in data["rows"] if r["slow"]) == ["h2", "h2", "h2"]
    assert open(data["summary"]["heatmap"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "SLOW HOST h2: slow with every peer, sending (egress)" in done.stdout

    shaped = run_cli("lab", "shape", "--name", lab_name, "--pair-link", "h0-h1=100mbit")
    assert shaped.returncode == 0, shaped.stderr
    done, data = _hunt(run_cli, lab_name, tmp_path, "link")
    assert done.returncode == 1, done.stderr
    assert last_line(done.stderr) == "microbench: hunt found slow link h0<->h1 (verdict and matrix above)"
    assert data["summary"]["slow_hosts"] == [] and data["summary"]["slow_links"] == [["h0", "h1"]]

    run_cli("lab", "shape", "--name", lab_name, "--link", "1gbit")
    done, data = _hunt(run_cli, lab_name, tmp_path, "clean")
    assert done.returncode == 0, done.stdout + done.stderr
    assert data["summary"]["slow_hosts"] == [] and data["summary"]["slow_links"] == []
    assert "OK: every link reaches" in done.stdout


# ---------------------------------------------------------------------- --bisect


def test_halves_and_which_half_is_slow():
    assert hunt.halves([0, 1, 2, 3, 4]) == ([0, 1], [2, 3, 4])
    assert hunt.slower_half(0.12, 0.012, 0.7) == 1
    assert hunt.slower_half(0.012, 0.12, 0.7) == 0
    assert hunt.slower_half(0.12, 0.10, 0.7) is None          # alike: a slow link across the halves, or none
    assert hunt.slower_half(0.01, 0.012, 0.7) is None         # both slow: not one host
    assert hunt.slower_half(0.12, 0.10, 0.7, floor_gbps=0.11) == 1


def test_confirm_set_pads_the_suspects_with_cleared_hosts_to_four():
    assert hunt.confirm_set([6, 7], [0, 1, 2, 3, 4, 5]) == [0, 1, 6, 7]
    assert hunt.confirm_set([3, 4, 5], [0, 1, 2]) == [0, 3, 4, 5]
    assert len(hunt.rounds(len(hunt.confirm_set([6, 7], [0, 1])))) == 3


def test_matrix_table_marks_unmeasured_cells():
    matrix = {(0, 1): 0.12, (1, 0): 0.12}
    assert hunt.matrix_table(matrix, NAMES[:3], set())[2] == ["h2", ".", ".", "-"]


@pytest.mark.slow
@pytest.mark.root
def test_bisect_on_three_hosts_is_refused_before_the_ranks_start(run_cli, lab_name):
    assert run_cli("lab", "up", "--hosts", "3", "--name", lab_name).returncode == 0
    done = run_cli("hunt", "--lab", lab_name, "--bisect")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "hunt --bisect needs at least 4 hosts" in last_line(done.stderr)


@pytest.mark.slow
@pytest.mark.root
def test_bisect_corners_the_slow_host_and_falls_back_for_a_link_across_halves(run_cli, lab_name, tmp_path):
    up = run_cli("lab", "up", "--hosts", "4", "--link", "1gbit", "--host-link", "h2=100mbit", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    record = tmp_path / "bisect-host.json"
    done = run_cli("hunt", "--lab", lab_name, "--bisect", "--json", str(record), timeout=240)
    data = json.loads(record.read_text())
    assert done.returncode == 1, done.stderr
    assert last_line(done.stderr) == "microbench: hunt found slow host h2 (verdict and matrix above)"
    summary = data["summary"]
    assert summary["slow_hosts"] == ["h2"] and summary["slow_links"] == [] and summary["decided_by"] == "bisect"
    (step,) = summary["bisect"]
    assert step["halves"] == [["h0", "h1"], ["h2", "h3"]] and step["slow_half"] == 1
    assert step["busbw_gbps"][1] < 0.7 * step["busbw_gbps"][0]
    assert [r["slow"] for r in data["rows"] if r["phase"] == "bisect"] == [False, True]
    assert sorted(r["src"] for r in data["rows"] if r.get("slow") and r["phase"] == "confirm") == ["h2", "h2", "h2"]
    assert "DECIDED BY BISECT: 1 halving(s) cornered h2" in done.stdout

    # A slow link between the halves leaves both halves alike: all pairs decide, and name it.
    shaped = run_cli("lab", "shape", "--name", lab_name, "--link", "1gbit", "--pair-link", "h1-h2=100mbit")
    assert shaped.returncode == 0, shaped.stderr
    record = tmp_path / "bisect-link.json"
    done = run_cli("hunt", "--lab", lab_name, "--bisect", "--json", str(record), timeout=240)
    summary = json.loads(record.read_text())["summary"]
    assert done.returncode == 1, done.stderr
    assert summary["slow_hosts"] == [] and summary["slow_links"] == [["h1", "h2"]]
    assert summary["decided_by"] == "all pairs" and summary["bisect"][0]["slow_half"] is None
    assert "halving cannot tell the halves apart: all pairs decide" in done.stdout


def test_hunt_refuses_a_taken_default_heatmap_before_the_ranks_start(cli, tmp_path):
    (tmp_path / "h.png").write_bytes(b"mine")
    done = cli("hunt", "--lab", "nosuchlab", "--json", "h.json")
    assert done.returncode == 2
    assert "the default heatmap 'h.png' (the --json name with .png) already exists" in one_error_line(done.stderr)
    assert (tmp_path / "h.png").read_bytes() == b"mine" and not (tmp_path / "h.json").exists()


def test_a_hunt_record_named_at_run_time_gets_a_free_heatmap_name(tmp_path):
    from microbench.lab.hunt import free_heatmap

    (tmp_path / "hunt-1.png").write_bytes(b"x")
    assert free_heatmap(tmp_path / "hunt-1.json") == tmp_path / "hunt-1-1.png"
    assert free_heatmap(tmp_path / "hunt-2.json") == tmp_path / "hunt-2.png"
